//! `weir serve --tls-cert --tls-key`: HTTPS with rustls, with a certificate
//! made here (rcgen) and a client that trusts only it. Tokens work as over
//! plain HTTP; a plain-HTTP client gets no answer; a client that connects
//! and says nothing holds up no one; a bad certificate stops the start.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{start_with, text, tokens_of, weir, Scratch};

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

[window]
type = "tumbling"
size = "1m"
allowed_lateness = "0s"
late = "discard"

[[aggregate]]
name = "n"
fn = "count"
"#;

/// One HTTPS request trusting only `ca`; the status code and body.
fn https(port: u16, ca: &[u8], request: &str) -> std::io::Result<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from(ca.to_vec())).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn = rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap()).unwrap();
    let sock = TcpStream::connect(("127.0.0.1", port))?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(request.as_bytes())?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => return Err(e),
    }
    let answer = String::from_utf8_lossy(&out).into_owned();
    let code = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_owned());
    Ok((code, body))
}

fn get(path: &str, token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n")
}

#[test]
fn the_server_speaks_https_with_the_given_certificate() {
    let s = Scratch::new("tls");
    std::fs::create_dir_all(s.path("contracts")).unwrap();
    s.write("contracts/paid.toml", CONTRACT);
    s.write("weir.toml", "");
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_pem, key_pem) = (s.write("cert.pem", &cert.pem()), s.write("key.pem", &key_pair.serialize_pem()));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _server = start_with(&s.0, port, &[&"--tls-cert", &cert_pem, &"--tls-key", &key_pem]);
    let ca = cert.der().to_vec();

    let (code, body) = https(port, &ca, &get("/healthz", None)).unwrap();
    assert_eq!((code, body.trim()), (200, "{\"ok\":true}"));
    let reader = tokens_of(&s.path("data")).reader;
    let (code, body) = https(port, &ca, &get("/v1/pipelines", Some(&reader))).unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"name\":\"paid\""), "{body}");
    assert_eq!(https(port, &ca, &get("/v1/pipelines", None)).unwrap().0, 401);

    // A client that connects and sends nothing holds up no one.
    let idle = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let started = Instant::now();
    assert_eq!(https(port, &ca, &get("/healthz", None)).unwrap().0, 200);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    drop(idle);

    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    plain.write_all(get("/healthz", None).as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = plain.read_to_end(&mut out);
    assert!(!String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"), "{out:?}");

    // A certificate the client does not trust is refused by the client.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    assert!(https(port, other.cert.der(), &get("/healthz", None)).is_err());

    // `weir produce` and `weir results` reach it over HTTPS, trusting the
    // certificate WEIR_CA_CERT names, and nothing else.
    let url = format!("https://localhost:{port}");
    let file = s.write("e.jsonl", "{\"id\":\"p1\",\"acct\":\"a1\",\"t\":\"2026-11-30T12:00:00Z\"}\n");
    let tokens = tokens_of(&s.path("data"));
    let run = |token: &str, ca: &std::path::Path, args: &[&dyn AsRef<std::ffi::OsStr>]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .env("WEIR_TOKEN", token)
            .env("WEIR_CA_CERT", ca)
            .args(args.iter().map(|a| a.as_ref()))
            .output()
            .unwrap()
    };
    let produced = run(&tokens.producer, &cert_pem, &[&"produce", &"--url", &url, &"--topic", &"payments", &file]);
    assert!(produced.status.success(), "{}", String::from_utf8_lossy(&produced.stderr));
    let results = run(&tokens.reader, &cert_pem, &[&"results", &"paid", &"--url", &url, &"--format", &"json"]);
    assert!(results.status.success(), "{}", String::from_utf8_lossy(&results.stderr));
    let untrusted = s.write("other.pem", &other.cert.pem());
    let refused = run(&tokens.reader, &untrusted, &[&"results", &"paid", &"--url", &url]);
    assert!(!refused.status.success(), "a certificate it does not trust is refused");
}

#[test]
fn a_missing_or_mismatched_certificate_stops_the_start() {
    let s = Scratch::new("tls-bad");
    std::fs::create_dir_all(s.path("contracts")).unwrap();
    s.write("contracts/paid.toml", CONTRACT);
    let one = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let two = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = s.write("cert.pem", &one.cert.pem());
    let wrong_key = s.write("key.pem", &two.key_pair.serialize_pem());
    let serve = |cert: &dyn AsRef<std::ffi::OsStr>, key: &dyn AsRef<std::ffi::OsStr>| {
        weir(&[
            &"serve",
            &"--data",
            &s.path("data"),
            &"--contracts",
            &s.path("contracts"),
            &"--listen",
            &"127.0.0.1:0",
            &"--tls-cert",
            cert,
            &"--tls-key",
            key,
        ])
    };
    let out = serve(&s.path("missing.pem"), &wrong_key);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--tls-cert"), "{}", text(&out.stderr));
    let out = serve(&cert, &wrong_key);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("do not go together"), "{}", text(&out.stderr));
    let out = weir(&[&"serve", &"--data", &s.path("data"), &"--contracts", &s.path("contracts"), &"--tls-cert", &cert]);
    assert_eq!(out.status.code(), Some(2), "--tls-cert needs --tls-key");
}

/// An HTTPS webhook receiver with `certified`'s certificate: each
/// notification's JSON on the channel.
fn https_receiver(certified: &rcgen::CertifiedKey) -> (u16, std::sync::mpsc::Receiver<serde_json::Value>) {
    let chain = vec![certified.cert.der().clone()];
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.key_pair.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let config = Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(sock) = sock else { continue };
            let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
            let tls = rustls::StreamOwned::new(rustls::ServerConnection::new(Arc::clone(&config)).unwrap(), sock);
            let mut reader = std::io::BufReader::new(tls);
            if let Some(body) = common::request_body(&mut reader).filter(|b| !b.is_empty()) {
                let tls = reader.get_mut();
                let _ = tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = tls.flush();
                if let Ok(v) = serde_json::from_slice(&body) {
                    let _ = tx.send(v);
                }
            }
        }
    });
    (port, rx)
}

#[test]
fn point_10_an_https_webhook_gets_its_alerts_checked_against_webhook_ca_cert() {
    let s = Scratch::new("tls-hook");
    std::fs::create_dir_all(s.path("contracts")).unwrap();
    s.write("contracts/paid.toml", &format!("{CONTRACT}\n[alerts]\nmax_watermark_age = \"1s\"\n"));
    let hook = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (hook_port, notes) = https_receiver(&hook);
    let ca = s.write("hook-ca.pem", &hook.cert.pem());
    // A file with no certificate in it stops the start, naming it.
    let key_only = s.write("key-only.pem", &hook.key_pair.serialize_pem());
    s.write("weir.toml", &format!("webhook_ca_cert = {:?}\n", key_only.display().to_string()));
    let refused = weir(&[
        &"serve",
        &"--data",
        &s.path("data"),
        &"--contracts",
        &s.path("contracts"),
        &"--config",
        &s.path("weir.toml"),
        &"--listen",
        &"127.0.0.1:0",
    ]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("holds no PEM certificate"), "{}", text(&refused.stderr));

    // With the hook's certificate trusted, a firing alert reaches it over HTTPS.
    s.write(
        "weir.toml",
        &format!(
            "webhook_ca_cert = {:?}\nalert_webhook = \"https://localhost:{hook_port}/hook\"\nallow_private_webhooks = true\n",
            ca.display().to_string()
        ),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _server = common::start(&s.0, port);
    let event = "{\"id\":\"p1\",\"acct\":\"a1\",\"t\":\"2026-11-30T12:00:00Z\"}\n";
    let (code, answer) =
        common::call("POST", &format!("http://127.0.0.1:{port}/v1/topics/payments/events"), Some(event));
    assert_eq!(code, 200, "{answer}");
    let note = notes.recv_timeout(Duration::from_secs(30)).expect("no alert reached the https webhook");
    assert_eq!(note["pipeline"], "paid", "{note}");
    assert!(note.to_string().contains("watermark"), "{note}");
}

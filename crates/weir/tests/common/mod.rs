//! Helpers shared by the command-line tests: a scratch folder and the binary.

#![allow(dead_code)]

pub mod topology;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;

/// The payments contract most server tests run: approved payments per
/// account per minute, revised for two minutes, duplicates caught by
/// payment id, revenue and a count.
pub const PAID: &str = r#"[pipeline]
name = "paid"
version = 1
owner = "billing-ops"
steward = "data-platform"
decision = "Unlock paid features within seconds of payment approval"

[source]
topic = "payments"
event_time = "approved_at"
key = ["account_id"]
event_id = "payment_id"
where = 'status == "approved"'
max_delay = "5s"

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

/// A pipeline `name` of refunds per account per minute on the topic
/// `refunds`, owned by refunds-ops, alerting when its watermark is older
/// than `max_watermark_age`.
pub fn refunds(name: &str, max_watermark_age: &str) -> String {
    format!(
        r#"[pipeline]
name = "{name}"
version = 1
owner = "refunds-ops"
steward = "data-platform"
decision = "Refunds per account"

[source]
topic = "refunds"
event_time = "at"
key = ["account_id"]

[window]
type = "tumbling"
size = "1m"

[[aggregate]]
name = "refunds"
fn = "count"

[alerts]
max_watermark_age = "{max_watermark_age}"
"#
    )
}

pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "weir-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn weir(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir")).args(args.iter().map(|a| a.as_ref())).output().unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A `weir serve` child process, killed when dropped (a failing test
/// leaves no server behind).
pub struct Server {
    pub child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `weir serve` on `root`'s data, contracts and weir.toml, and waits
/// until it says it is serving.
pub fn start(root: &Path, port: u16) -> Server {
    start_with(root, port, &[])
}

/// [`start`] with more arguments to `weir serve` (such as `--tls-cert`).
pub fn start_with(root: &Path, port: u16, extra: &[&dyn AsRef<std::ffi::OsStr>]) -> Server {
    start_as(Command::new(env!("CARGO_BIN_EXE_weir")), root, port, extra)
}

/// [`start`] under an address-space limit (`ulimit -v`, in KiB): an
/// allocation past it fails, and the server with it. What the allocators
/// reserve ahead is address space, not memory (mimalloc's arena of 1 GiB,
/// glibc's 64 MiB for each thread's arena): they reserve little here, so
/// that the limit holds what the server uses.
pub fn start_within(root: &Path, port: u16, address_space_kib: u64) -> Server {
    let mut shell = Command::new("sh");
    shell.env("MIMALLOC_ARENA_RESERVE", "32MiB").env("MALLOC_ARENA_MAX", "1");
    shell.args(["-c", &format!("ulimit -v {address_space_kib} && exec \"$0\" \"$@\""), env!("CARGO_BIN_EXE_weir")]);
    start_as(shell, root, port, &[])
}

fn start_as(mut command: Command, root: &Path, port: u16, extra: &[&dyn AsRef<std::ffi::OsStr>]) -> Server {
    let tokens = tokens_of(&root.join("data"));
    TOKENS.lock().unwrap_or_else(|e| e.into_inner()).push((format!("127.0.0.1:{port}"), tokens));
    let mut child = command
        .args(["serve", "--data"])
        .arg(root.join("data"))
        .arg("--contracts")
        .arg(root.join("contracts"))
        .arg("--config")
        .arg(root.join("weir.toml"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .args(extra.iter().map(|a| a.as_ref()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the line that says it is serving.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent && (line.contains("serving http://") || line.contains("serving https://")) {
                let _ = tx.send(Ok(()));
                sent = true;
            } else if !sent {
                let _ = tx.send(Err(line));
            }
        }
    });
    // Pipelines may speak before the listener does (a partition taken, a
    // topic made): only a server that stops, or says nothing of serving
    // within 30 s, failed to start.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut said = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(())) => return Server { child },
            Ok(Err(line)) => said.push(line),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().ok();
                panic!("weir serve stopped ({status:?}) before serving; it said:\n{}", said.join("\n"))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("weir serve did not start within 30 s; it said:\n{}", said.join("\n"))
            }
        }
    }
}

/// One token of each role (over every topic and pipeline) of a server.
#[derive(Clone)]
pub struct Tokens {
    pub producer: String,
    pub reader: String,
    pub raw_reader: String,
    pub operator: String,
    pub admin: String,
}

/// Makes a token with `weir token create`.
pub fn make_token(data: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["token", "create", "--data"])
        .arg(data)
        .args(["--name", "test"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "weir token create {args:?}: {}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

/// The servers' tokens, by data folder and by `127.0.0.1:PORT`.
static TOKENS: std::sync::Mutex<Vec<(String, Tokens)>> = std::sync::Mutex::new(Vec::new());

fn registered(key: &str) -> Option<Tokens> {
    TOKENS.lock().unwrap_or_else(|e| e.into_inner()).iter().rev().find(|(k, _)| k == key).map(|(_, t)| t.clone())
}

/// The tokens of the server on `data` (made once per folder).
pub fn tokens_of(data: &Path) -> Tokens {
    let key = data.display().to_string();
    if let Some(t) = registered(&key) {
        return t;
    }
    let all = |role: &str, scope: &str| make_token(data, &["--role", role, scope, "*"]);
    let t = Tokens {
        producer: all("producer", "--topic"),
        reader: all("reader", "--pipeline"),
        raw_reader: all("raw-reader", "--topic"),
        operator: all("operator", "--pipeline"),
        admin: make_token(data, &["--role", "admin"]),
    };
    TOKENS.lock().unwrap_or_else(|e| e.into_inner()).push((key, t.clone()));
    t
}

/// Which token a test's request to `url` uses: the role its path needs.
pub fn token_for(method: &str, url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let t = registered(host)?;
    let path = format!("/{}", path.split('?').next().unwrap_or(""));
    let operator_action = [
        "/pause",
        "/resume",
        "/annotations",
        "/replay",
        "/promote",
        "/rollback",
        "/backfill",
        "/reconcile",
        "/incidents",
        "/notes",
        "/mitigate",
        "/resolve",
        "/drills",
    ]
    .iter()
    .any(|a| path.ends_with(a));
    Some(match (method, path.as_str()) {
        ("POST", p) if p.starts_with("/v1/topics/") => t.producer,
        (_, p) if p.starts_with("/v1/topics/") => t.raw_reader,
        ("POST", _) if operator_action => t.operator,
        (_, p)
            if p.starts_with("/v1/audit") || p.starts_with("/v1/tokens") || p == "/v1/dashboard" || p == "/readyz" =>
        {
            t.admin
        }
        _ => t.reader,
    })
}

/// A request with the token its path needs (see [`token_for`]).
pub fn authed<B>(r: ureq::RequestBuilder<B>, method: &str, url: &str) -> ureq::RequestBuilder<B> {
    match token_for(method, url) {
        Some(t) => r.header("authorization", format!("Bearer {t}")),
        None => r,
    }
}

/// `weir ARGS` with `WEIR_TOKEN` set.
pub fn weir_as(token: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .env("WEIR_TOKEN", token)
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap()
}

/// An HTTP client that answers every status (a test looks at it).
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into()
}

/// A request with the token its path needs; the status and the body.
pub fn call(method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let mut r = match body {
        None => authed(agent().get(url), method, url).call().unwrap(),
        Some(b) => authed(agent().post(url), method, url).header("content-type", "application/json").send(b).unwrap(),
    };
    (r.status().as_u16(), r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap())
}

/// A GET with the token its path needs that may take up to `limit`; the status and the body.
pub fn get_within(url: &str, limit: Duration) -> (u16, String) {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(limit)).build().into();
    let mut r = authed(agent.get(url), "GET", url).call().unwrap();
    (r.status().as_u16(), r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap())
}

/// A GET that must answer 200; the body, every page of it (following
/// `Weir-Next`, SPEC.md 7).
pub fn get(url: &str) -> String {
    let (code, body, next) = get_page(url);
    assert_eq!(code, 200, "{url}: {body}");
    let mut body = body;
    let origin = url.find("/v1/").map_or(url, |at| &url[..at]).to_owned();
    let mut next = next;
    while let Some(path) = next.take() {
        let (code, more, after) = get_page(&format!("{origin}{path}"));
        assert_eq!(code, 200, "{path}: {more}");
        body.push_str(&more);
        next = after;
    }
    body
}

/// One page of a GET: the status, the body and `Weir-Next`.
pub fn get_page(url: &str) -> (u16, String, Option<String>) {
    let mut r = authed(agent().get(url), "GET", url).call().unwrap();
    let next = r.headers().get("weir-next").map(|v| v.to_str().unwrap().to_owned());
    (r.status().as_u16(), r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap(), next)
}

pub fn json_lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The body of one HTTP/1.1 request read from `reader` (its head up to the
/// blank line, then `Content-Length` bytes); `None` if it ends first.
pub fn request_body(reader: &mut impl std::io::BufRead) -> Option<Vec<u8>> {
    request(reader).map(|r| r.body)
}

/// One request a [`listener`] got.
pub struct Received {
    pub path: String,
    /// Whether its `Content-Type` is JSON.
    pub json: bool,
    pub body: Vec<u8>,
}

/// One HTTP/1.1 request read from `reader`; `None` if it ends first.
pub fn request(reader: &mut impl std::io::BufRead) -> Option<Received> {
    let mut first = String::new();
    if reader.read_line(&mut first).ok()? == 0 {
        return None;
    }
    let (mut length, mut json) = (0, false);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        let line = line.to_ascii_lowercase();
        if let Some(v) = line.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        json |= line.starts_with("content-type: application/json");
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let path = first.split(' ').nth(1).unwrap_or_default().to_owned();
    Some(Received { path, json, body })
}

/// An HTTP server on loopback answering every request 200 `{}` (a webhook,
/// an OpenTelemetry collector): its base URL, and every request, in order.
pub fn listener() -> (String, std::sync::mpsc::Receiver<Received>) {
    use std::io::{BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            if let Some(r) = request(&mut reader) {
                let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
                let _ = stream.write_all(answer.as_bytes());
                let _ = tx.send(r);
            }
        }
    });
    (url, rx)
}

/// A webhook receiver: every POST body that is JSON, in order.
pub fn receiver() -> (String, std::sync::mpsc::Receiver<Value>) {
    let (base, requests) = listener();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for r in requests {
            if let Ok(v) = serde_json::from_slice(&r.body) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    (format!("{base}/hook"), rx)
}

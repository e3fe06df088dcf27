//! Alert notifications to webhooks: each webhook URL has its own bounded
//! queue and its own delivery thread, so a dead hook delays only its own
//! notifications. A full queue drops its oldest notification (the newest
//! say more about now) and counts it. A URL that reaches a link-local or
//! cloud metadata address is refused unless weir.toml allows it
//! (`allow_link_local_webhooks = true`): a contract's author must not be
//! able to make the server call the machine's metadata service. An
//! `https` webhook is checked against the public roots, or only against
//! the certificates of weir.toml's `webhook_ca_cert` ([`roots`]).

use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use weir_runtime::lock;

/// The webhooks' queues and what happened to their notifications.
#[derive(Default)]
pub struct Webhooks {
    queues: Mutex<BTreeMap<String, Arc<Queue>>>,
    /// Notifications dropped because their webhook's queue was full.
    pub dropped: AtomicU64,
    /// Delivered, and given up after a minute of retries (or refused).
    pub delivered: Arc<AtomicU64>,
    pub undelivered: Arc<AtomicU64>,
    /// What `https` webhooks are checked against (see [`roots`]); the
    /// public roots until it is set.
    pub trusted: std::sync::OnceLock<ureq::tls::RootCerts>,
}

/// The certificates of `webhook_ca_cert` (a PEM file), or why they cannot
/// be used: the file unreadable, or holding no certificate.
pub fn roots(path: &str) -> Result<ureq::tls::RootCerts, String> {
    let pem = std::fs::read(path).map_err(|e| format!("webhook_ca_cert {path:?} cannot be read: {e}"))?;
    let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(format!(
            "webhook_ca_cert {path:?} holds no PEM certificate; give the file of the CA (or of the hook's own certificate) that https webhooks are checked against"
        ));
    }
    Ok(ureq::tls::RootCerts::from(certs))
}

#[derive(Default)]
struct Queue {
    notes: Mutex<VecDeque<serde_json::Value>>,
    ready: Condvar,
}

impl Webhooks {
    /// Queues `note` for `url` without waiting; `capacity` notifications
    /// wait at most per webhook. Returns the one dropped to make room.
    pub fn send(
        &self,
        url: &str,
        note: serde_json::Value,
        capacity: usize,
        allow_link_local: bool,
    ) -> Option<serde_json::Value> {
        let queue = {
            let mut queues = lock(&self.queues);
            match queues.get(url) {
                Some(q) => Arc::clone(q),
                None => {
                    let q = Arc::new(Queue::default());
                    queues.insert(url.to_owned(), Arc::clone(&q));
                    let (u, q2) = (url.to_owned(), Arc::clone(&q));
                    let (ok, failed) = (Arc::clone(&self.delivered), Arc::clone(&self.undelivered));
                    let trusted = self.trusted.get().cloned();
                    let spawned = std::thread::Builder::new()
                        .name("weir-webhook".into())
                        .spawn(move || deliver(&u, &q2, (allow_link_local, trusted), &ok, &failed));
                    if let Err(e) = spawned {
                        eprintln!("weir: no delivery thread for the webhook {url}: {e}");
                    }
                    q
                }
            }
        };
        let mut notes = lock(&queue.notes);
        notes.push_back(note);
        let dropped = if notes.len() > capacity.max(1) { notes.pop_front() } else { None };
        drop(notes);
        queue.ready.notify_one();
        if dropped.is_some() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        dropped
    }
}

/// Why `url` may not be a webhook: it names (or its host resolves to) a
/// link-local or cloud metadata address.
pub fn refused(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host_port.rsplit_once(':').map_or(host_port, |(h, _)| h),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if matches!(host.as_str(), "metadata.google.internal" | "metadata" | "metadata.azure.internal") {
        return Some(format!("{host} is a cloud metadata service"));
    }
    let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => (host.as_str(), 80).to_socket_addrs().map(|a| a.map(|s| s.ip()).collect()).unwrap_or_default(),
    };
    addrs.into_iter().find(|ip| link_local(*ip)).map(|ip| format!("{host} is the link-local or metadata address {ip}"))
}

fn link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => {
            (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6 == "fd00:ec2::254".parse::<std::net::Ipv6Addr>().unwrap_or(std::net::Ipv6Addr::UNSPECIFIED)
                || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_link_local())
        }
    }
}

/// Sends one webhook's notifications in order, each retried with backoff
/// for up to a minute.
fn deliver(
    url: &str,
    queue: &Queue,
    (allow_link_local, trusted): (bool, Option<ureq::tls::RootCerts>),
    delivered: &AtomicU64,
    undelivered: &AtomicU64,
) {
    let mut config =
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(10)));
    if let Some(roots) = trusted {
        config = config.tls_config(ureq::tls::TlsConfig::builder().root_certs(roots).build());
    }
    let agent: ureq::Agent = config.build().into();
    loop {
        let note = {
            let mut notes = lock(&queue.notes);
            loop {
                if let Some(n) = notes.pop_front() {
                    break n;
                }
                notes = queue.ready.wait(notes).unwrap_or_else(|e| e.into_inner());
            }
        };
        // Asked at each delivery: a name may come to resolve elsewhere.
        if let Some(why) = refused(url).filter(|_| !allow_link_local) {
            eprintln!("weir: an alert was not sent to {url}: {why}; set allow_link_local_webhooks = true in weir.toml if it must be");
            undelivered.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let started = Instant::now();
        let mut wait = Duration::from_millis(250);
        let body = note.to_string();
        loop {
            let sent = agent.post(url).header("content-type", "application/json").send(&body);
            if matches!(&sent, Ok(r) if r.status().is_success()) {
                delivered.fetch_add(1, Ordering::Relaxed);
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                eprintln!("weir: could not deliver an alert to {url} for a minute; it stays in status");
                undelivered.fetch_add(1, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(8));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_10_link_local_and_metadata_addresses_are_refused() {
        for url in [
            "http://169.254.169.254/latest/meta-data/",
            "http://169.254.1.2:8080/hook",
            "http://[fe80::1]/hook",
            "http://[fd00:ec2::254]/",
            "https://metadata.google.internal/computeMetadata/v1/",
            "http://user:pw@169.254.169.254/",
        ] {
            assert!(refused(url).is_some(), "{url}");
        }
        for url in ["http://127.0.0.1:9000/hook", "https://hooks.example.com/weir", "http://10.0.0.5/hook"] {
            assert_eq!(refused(url), None, "{url}");
        }
    }

    #[test]
    fn point_10_each_webhook_has_its_own_queue_that_drops_its_oldest() {
        let hooks = Webhooks::default();
        // Nothing listens on port 9: the dead hook's queue fills, and drops its oldest.
        let dead = "http://127.0.0.1:9/dead";
        let mut dropped = Vec::new();
        for i in 0..10 {
            dropped.extend(hooks.send(dead, serde_json::json!({ "n": i }), 3, false));
        }
        assert!(dropped.len() >= 6, "{dropped:?}");
        assert!(dropped.windows(2).all(|w| w[0]["n"].as_i64() < w[1]["n"].as_i64()), "oldest first: {dropped:?}");
        assert_eq!(hooks.dropped.load(Ordering::Relaxed), dropped.len() as u64);
        // A live hook beside it gets its notification at once.
        let (url, received) = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}/live", listener.local_addr().unwrap());
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                for s in listener.incoming() {
                    let Ok(mut s) = s else { continue };
                    let mut buf = [0u8; 4096];
                    let n = s.read(&mut buf).unwrap_or(0);
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                    let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                }
            });
            (url, rx)
        };
        assert_eq!(hooks.send(&url, serde_json::json!({ "live": true }), 3, false), None);
        let got = received.recv_timeout(Duration::from_secs(5)).expect("the live hook waited for the dead one");
        assert!(got.contains("\"live\":true") || got.contains("POST /live"), "{got}");
    }
}

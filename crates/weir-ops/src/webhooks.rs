//! Alert notifications to webhooks: each webhook URL has its own bounded
//! queue and its own delivery thread, so a dead hook delays only its own
//! notifications. A full queue drops its oldest notification (the newest
//! say more about now) and counts it.
//!
//! A contract's author must not be able to make the server call what only
//! the server can reach, so deliveries go through
//! [`weir_runtime::outbound`]: no redirect is followed (a 3xx is a failed
//! delivery), the name is resolved once per connection and the connection
//! goes to the addresses that were checked (no DNS rebinding), and
//! loopback and private addresses are refused unless weir.toml says
//! `allow_private_webhooks = true`, link-local and cloud metadata ones
//! (169.254.169.254, 100.100.100.200, fd00:ec2::254) unless it says
//! `allow_link_local_webhooks = true`. An `https` webhook is checked
//! against the system's roots, or only against the certificates of
//! weir.toml's `webhook_ca_cert` ([`roots`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use weir_runtime::lock;
use weir_runtime::outbound::{self, Allow};

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
    pub fn send(&self, url: &str, note: serde_json::Value, capacity: usize, allow: Allow) -> Option<serde_json::Value> {
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
                        .spawn(move || deliver(&u, &q2, (allow, trusted), &ok, &failed));
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

/// Why `url` may not be a webhook under `allow`, checked before a server
/// starts: it names, or its host resolves to now, a refused address. A name
/// that does not resolve now is checked again at each delivery.
pub fn refused(url: &str, allow: Allow) -> Option<String> {
    outbound::check_url_for(url, allow, outbound::WEBHOOK_HINT, false).err()
}

/// Sends one webhook's notifications in order, each retried with backoff
/// for up to a minute.
fn deliver(
    url: &str,
    queue: &Queue,
    (allow, trusted): (Allow, Option<ureq::tls::RootCerts>),
    delivered: &AtomicU64,
    undelivered: &AtomicU64,
) {
    let agent = outbound::guarded_agent(allow, outbound::WEBHOOK_HINT, Duration::from_secs(10), trusted);
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
        let started = Instant::now();
        let mut wait = Duration::from_millis(250);
        let body = note.to_string();
        loop {
            // The address is checked at each connection: a name may come to resolve elsewhere.
            let sent = agent.post(url).header("content-type", "application/json").send(&body);
            if matches!(&sent, Ok(r) if r.status().is_success()) {
                delivered.fetch_add(1, Ordering::Relaxed);
                break;
            }
            if let Err(ureq::Error::Io(e)) = &sent {
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    eprintln!("weir: an alert was not sent to {url}: {e}");
                    undelivered.fetch_add(1, Ordering::Relaxed);
                    break;
                }
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

    /// Loopback and private addresses allowed, as the tests' local hooks need.
    const LOCAL: Allow = Allow { private: true, link_local: false };

    #[test]
    fn point_10_link_local_and_metadata_addresses_are_refused() {
        for url in [
            "http://169.254.169.254/latest/meta-data/",
            "http://169.254.1.2:8080/hook",
            "http://[fe80::1]/hook",
            "http://[fd00:ec2::254]/",
            "http://100.100.100.200/latest/meta-data/",
            "https://metadata.google.internal/computeMetadata/v1/",
            "http://user:pw@169.254.169.254/",
        ] {
            assert!(refused(url, LOCAL).is_some(), "{url}");
            assert_eq!(refused(url, Allow { private: false, link_local: true }), None, "{url} allowed");
        }
        for url in ["http://127.0.0.1:9000/hook", "https://hooks.example.com/weir", "http://10.0.0.5/hook"] {
            assert_eq!(refused(url, LOCAL), None, "{url}");
        }
    }

    #[test]
    fn review_2_point_5_loopback_and_private_hooks_are_refused_unless_allowed() {
        for url in ["http://127.0.0.1:9000/hook", "http://[::1]/hook", "http://10.0.0.5/hook", "http://192.168.1.9/"] {
            let why = refused(url, Allow::default()).unwrap_or_default();
            assert!(why.contains("allow_private_webhooks = true"), "{url}: {why:?}");
        }
        assert_eq!(refused("https://hooks.example.com/weir", Allow::default()), None);
    }

    #[test]
    fn review_2_point_5_a_hook_answering_with_a_redirect_is_not_followed() {
        use std::io::{Read, Write};
        let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        elsewhere.set_nonblocking(true).unwrap();
        let target = format!("http://{}/metadata", elsewhere.local_addr().unwrap());
        let hook = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", hook.local_addr().unwrap());
        let (tx, asked) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for conn in hook.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head);
                let answer = format!(
                    "HTTP/1.1 302 Found\r\nlocation: {target}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = conn.write_all(answer.as_bytes());
                let _ = tx.send(());
            }
        });
        let hooks = Webhooks::default();
        assert_eq!(hooks.send(&url, serde_json::json!({ "n": 1 }), 3, LOCAL), None);
        asked.recv_timeout(Duration::from_secs(5)).expect("the hook was not called");
        // Retries come back to the hook; the redirect's target is never called.
        std::thread::sleep(Duration::from_millis(1_500));
        assert!(asked.try_recv().is_ok(), "a 302 is a failed delivery, tried again at the hook");
        assert!(elsewhere.accept().is_err(), "the redirect was followed");
        assert_eq!(hooks.delivered.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn point_10_each_webhook_has_its_own_queue_that_drops_its_oldest() {
        let hooks = Webhooks::default();
        // Nothing listens on port 9: the dead hook's queue fills, and drops its oldest.
        let dead = "http://127.0.0.1:9/dead";
        let mut dropped = Vec::new();
        for i in 0..10 {
            dropped.extend(hooks.send(dead, serde_json::json!({ "n": i }), 3, LOCAL));
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
        assert_eq!(hooks.send(&url, serde_json::json!({ "live": true }), 3, LOCAL), None);
        let got = received.recv_timeout(Duration::from_secs(5)).expect("the live hook waited for the dead one");
        assert!(got.contains("\"live\":true") || got.contains("POST /live"), "{got}");
    }
}

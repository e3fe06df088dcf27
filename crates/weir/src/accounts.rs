//! The account service that `weir demo` and `weir bench effect` run beside
//! the server: the receiver of `paid_revenue`'s `http` destination, where
//! the decision acts. It unlocks an account's paid features when a row
//! with a payment of that account arrives, applies each `Idempotency-Key`
//! once (a batch sent again after a crash is answered and not applied
//! twice), and measures the time from a payment's approval (the producer
//! tells it, [`AccountService::approved`]) to its account's unlock.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    keys: HashSet<String>,
    batches: u64,
    repeated: u64,
    unlocked: HashSet<String>,
    /// Accounts whose first payment's approval is timed, and when.
    approved: HashMap<String, Instant>,
    /// Approval to unlock, of each timed account unlocked, with the account.
    latencies: Vec<(Duration, String)>,
}

/// What the account service has done so far.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub unlocked: usize,
    pub batches: u64,
    /// Batches received again under a key already applied.
    pub repeated: u64,
    /// Approval to unlock of the timed accounts, sorted.
    pub latencies: Vec<Duration>,
    /// The slowest five, with their accounts.
    pub slowest: Vec<(Duration, String)>,
}

impl Summary {
    /// The `q` quantile (0 to 1) of the approval-to-unlock times.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let n = self.latencies.len();
        (n > 0).then(|| self.latencies[((n as f64 * q).ceil() as usize).clamp(1, n) - 1])
    }
}

pub struct AccountService {
    /// Where the destination POSTs.
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl AccountService {
    /// Listens on a free loopback port, answering each connection on a thread of its own.
    pub fn start() -> std::io::Result<AccountService> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}/unlocks", listener.local_addr()?);
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        std::thread::Builder::new().name("weir-accounts".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = Arc::clone(&shared);
                let _ =
                    std::thread::Builder::new().name("weir-accounts-conn".into()).spawn(move || serve(stream, &state));
            }
        })?;
        Ok(AccountService { url, state })
    }

    /// `account`'s first payment was approved now: its unlock is timed.
    pub fn approved(&self, account: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.approved.entry(account.to_owned()).or_insert_with(Instant::now);
    }

    pub fn summary(&self) -> Summary {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut timed = s.latencies.clone();
        timed.sort();
        let latencies = timed.iter().map(|(d, _)| *d).collect();
        let slowest = timed.iter().rev().take(5).cloned().collect();
        Summary { unlocked: s.unlocked.len(), batches: s.batches, repeated: s.repeated, latencies, slowest }
    }
}

/// Answers one connection's requests (HTTP/1.1, kept alive) until it closes.
fn serve(stream: std::net::TcpStream, state: &Mutex<State>) {
    let Ok(mut out) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    while let Some((key, body)) = request(&mut reader) {
        apply(state, &key, &body);
        let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// One request's `Idempotency-Key` and body; `None` when the connection ends.
fn request(reader: &mut impl BufRead) -> Option<(String, String)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let (mut length, mut key) = (0usize, String::new());
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().ok()?,
                "idempotency-key" => key = value.trim().to_owned(),
                _ => {}
            }
        }
    }
    let mut body = vec![0; length.min(64 << 20)];
    reader.read_exact(&mut body).ok()?;
    Some((key, String::from_utf8(body).ok()?))
}

/// Applies a batch once: each row with a payment unlocks its account.
fn apply(state: &Mutex<State>, key: &str, body: &str) {
    let now = Instant::now();
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    s.batches += 1;
    if !s.keys.insert(key.to_owned()) {
        s.repeated += 1;
        return;
    }
    for line in body.lines() {
        let Ok(row) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let Some(account) = row["key"]["account_id"].as_str() else { continue };
        if row["values"]["payments"].as_u64().unwrap_or(0) == 0 || s.unlocked.contains(account) {
            continue;
        }
        s.unlocked.insert(account.to_owned());
        if let Some(at) = s.approved.remove(account) {
            s.latencies.push((now.duration_since(at), account.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_unlocks_once_and_times_the_approved_accounts() {
        let state = Mutex::new(State::default());
        state.lock().unwrap().approved.insert("new-1".into(), Instant::now());
        let body = "{\"seq\":1,\"key\":{\"account_id\":\"new-1\"},\"values\":{\"payments\":1}}\n{\"seq\":2,\"key\":{\"account_id\":\"acct-2\"},\"values\":{\"payments\":0}}\n";
        apply(&state, "paid/1/1-2", body);
        apply(&state, "paid/1/1-2", body);
        let s = state.lock().unwrap();
        assert_eq!((s.batches, s.repeated, s.unlocked.len(), s.latencies.len()), (2, 1, 1, 1));
    }
}

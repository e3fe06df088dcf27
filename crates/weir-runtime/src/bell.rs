//! A pipeline's bell: rung after every checkpoint this process commits (and
//! every operator action that publishes: a resume, a promote, a rollback),
//! so the change feed's long polls and server-sent events, and the
//! destinations, learn at once that the stream may have grown. It is a hint:
//! waiters read the store to see what changed, and read it every
//! [`Bell::POLL`] anyway, since another worker's commits (Kafka) ring no
//! bell here.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

#[derive(Default)]
pub struct Bell {
    rung: Mutex<u64>,
    sync: Condvar,
    notify: tokio::sync::Notify,
}

impl Bell {
    /// How long a waiter waits without a ring before reading the store again.
    pub const POLL: Duration = Duration::from_millis(250);

    pub fn ring(&self) {
        let mut n = crate::lock(&self.rung);
        *n = n.wrapping_add(1);
        drop(n);
        self.sync.notify_all();
        self.notify.notify_waiters();
    }

    /// How often it has rung.
    pub fn rung(&self) -> u64 {
        *crate::lock(&self.rung)
    }

    /// Blocks until it rings after `seen` (a value of [`Bell::rung`]) or `at_most` passes.
    pub fn wait(&self, seen: u64, at_most: Duration) {
        let n = crate::lock(&self.rung);
        if *n != seen {
            return;
        }
        let _ = self.sync.wait_timeout_while(n, at_most, |n| *n == seen);
    }

    /// A future that completes at the next ring (register it before reading
    /// the store, so a ring in between is not missed).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_wakes_a_waiter_and_a_missed_ring_is_seen() {
        let bell = std::sync::Arc::new(Bell::default());
        let seen = bell.rung();
        bell.ring();
        let t = std::time::Instant::now();
        bell.wait(seen, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(1), "a ring before the wait is not missed");
        let b = std::sync::Arc::clone(&bell);
        let seen = bell.rung();
        let ringer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            b.ring();
        });
        bell.wait(seen, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(2));
        ringer.join().unwrap();
    }
}

//! weir's runtime: one pipeline runner over a source, its checkpoint
//! protocol and restart loop, and the destinations.
//!
//! ```text
//!  embedded::LogSource (one engine reads every partition) ──┐
//!  kafka::KafkaSource (an engine per partition held) ───────┴──> runner::Runner ──> weir-store Checkpoints
//!                                                      (SqliteCheckpoints: per pipeline; PgCheckpoints: per partition, fenced)
//!                                                      operator actions read from the store every interval
//! ```
//!
//! A runner never answers anyone: the HTTP side writes operator actions to
//! the store and reads rows from it, and reads a runner's [`status::Status`].
//! Time reaches a runner through a [`Clock`], so a test can drive it step
//! by step on a simulated clock.

pub mod backfill;
pub mod bell;
pub mod causes;
pub mod destination;
pub mod drill;
pub mod embedded;
pub mod error;
pub mod histogram;
pub mod kafka;
pub mod outbound;
pub mod pg_destination;
pub mod privacy;
pub mod reconcile;
pub mod runner;
pub mod status;
pub mod telemetry;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use error::{Context, Error, Result};
pub use status::{KafkaPartition, Pipeline, PipelineVersion, Status};
pub use weir_store::Replay;

/// During a replay from an event time, which rebuilt rows are left out: a
/// window that ended at or before the replay's time and had settled before
/// the replay keeps its published row. Every other window is republished
/// (a window still open or only provisional when the replay started would
/// otherwise never get its settled row).
#[derive(Debug, Clone, Copy)]
pub struct KeepPublished {
    /// The replay's `from_time`.
    pub after: i64,
    /// The watermark of the state the replay replaced.
    pub watermark: Option<i64>,
    pub lateness_ms: i64,
}

impl KeepPublished {
    pub fn new(contract: &weir_contract::Contract, after: i64, watermark: Option<i64>) -> KeepPublished {
        KeepPublished { after, watermark, lateness_ms: contract.window.allowed_lateness_ms }
    }

    /// Whether `row`'s window keeps the row published before the replay.
    pub fn keeps(&self, row: &weir_engine::Row) -> bool {
        let settled = |end: i64| self.watermark.is_some_and(|wm| end.saturating_add(self.lateness_ms) <= wm);
        row.window_end.is_some_and(|end| end <= self.after && settled(end))
    }
}

/// Time as a runner sees it.
pub trait Clock {
    /// Milliseconds since some start, never going back: intervals and idleness.
    fn monotonic_ms(&self) -> u64;
    /// Milliseconds since the Unix epoch: what is stored and shown.
    fn wall_ms(&self) -> i64;
}

/// The machine's clocks.
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        SystemClock { start: Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn monotonic_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn wall_ms(&self) -> i64 {
        weir_log::now_ms()
    }
}

/// Runs `attempt` (given why it starts) until it returns `Ok` (a stop) or
/// `stop` is set. After a failure it waits 0.5 s, doubling to 30 s (back to
/// 0.5 s after a minute of running), and starts it again; `status` shows
/// the failure and counts the restart.
pub fn supervise(
    name: &str,
    status: &Mutex<Status>,
    stop: &AtomicBool,
    mut attempt: impl FnMut(&str) -> crate::Result<()>,
) {
    let mut backoff = Duration::from_millis(500);
    let mut why = "server start".to_owned();
    loop {
        let started = Instant::now();
        // A panic fails the run as an error does: the pipeline is marked
        // failed (so /readyz says not ready) and starts again after the backoff.
        let result = caught(|| attempt(&why)).unwrap_or_else(|p| Err(crate::refused!("it panicked: {p}")));
        let Err(e) = result else { return };
        why = format!("restart after a failure: {e:#}");
        let message = format!("pipeline {name} failed and restarts from its last checkpoint: {e:#}");
        eprintln!("weir: {message}");
        {
            let mut s = lock(status);
            s.failed = Some(message);
            s.restarts += 1;
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(500);
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// Runs `f`, catching a panic; its message when it panicked.
pub fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned())
    })
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_11_a_panicking_run_is_marked_failed_and_restarted_with_backoff() {
        let status = Mutex::new(Status::default());
        let stop = AtomicBool::new(false);
        let mut runs = Vec::new();
        let started = Instant::now();
        supervise("paid", &status, &stop, |why| {
            runs.push((why.to_owned(), started.elapsed()));
            match runs.len() {
                1 => panic!("an index out of bounds"),
                2 => {
                    // The failure shows while it waits, as /readyz reads it.
                    let s = lock(&status);
                    assert!(s.failed.as_deref().is_some_and(|f| f.contains("panicked: an index out of bounds")));
                    assert_eq!(s.restarts, 1);
                    crate::bail!("then an error")
                }
                _ => Ok(()),
            }
        });
        assert_eq!(runs.len(), 3, "{runs:?}");
        assert!(runs[1].0.contains("it panicked: an index out of bounds"), "{runs:?}");
        assert!(
            runs[1].1 >= Duration::from_millis(500) && runs[2].1 - runs[1].1 >= Duration::from_secs(1),
            "backoff doubles: {runs:?}"
        );
        assert_eq!(lock(&status).restarts, 2);
    }

    #[test]
    fn point_11_caught_gives_the_panic_message() {
        assert_eq!(caught(|| 7), Ok(7));
        assert_eq!(caught(|| -> u8 { panic!("static text") }), Err("static text".to_owned()));
        let n = 3;
        assert_eq!(caught(|| -> u8 { panic!("formatted {n}") }), Err("formatted 3".to_owned()));
    }
}

//! weir's runtime: one pipeline runner over a source, its checkpoint
//! protocol and restart loop, and the sink.
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
pub mod embedded;
pub mod histogram;
pub mod kafka;
pub mod privacy;
pub mod reconcile;
pub mod runner;
pub mod sink;
pub mod status;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    mut attempt: impl FnMut(&str) -> anyhow::Result<()>,
) {
    let mut backoff = Duration::from_millis(500);
    let mut why = "server start".to_owned();
    loop {
        let started = Instant::now();
        let Err(e) = attempt(&why) else { return };
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

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

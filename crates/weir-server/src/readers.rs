//! Readers' store calls (rows, changes, ledger, provenance, reports, the
//! dashboard) run on threads of their own at a lower CPU priority (nice
//! +10 on Linux), so a flood of reads takes the CPU only when producers,
//! token checks and pipelines leave it idle: a waiting producer or
//! pipeline thread runs first. Their connections are still bounded by the
//! store's pool (`pool_connections`).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

/// The nice value readers' threads take: a CPU share of about a tenth
/// against threads at 0 when both are runnable.
pub const NICE: i32 = 10;

static POOL: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();

/// Starts `threads` reader threads (once; later calls do nothing).
pub fn start(threads: u32) {
    POOL.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let spawned = std::thread::Builder::new().name(format!("weir-reader-{i}")).spawn(move || serve(&rx));
            if let Err(e) = spawned {
                eprintln!("weir serve: cannot start reader thread {i}: {e}");
            }
        }
        Mutex::new(tx)
    });
}

fn serve(jobs: &Mutex<Receiver<Job>>) {
    lower_priority();
    loop {
        let next = jobs.lock().unwrap_or_else(|e| e.into_inner()).recv();
        match next {
            // A panic in one read is the caller's 500, not the thread's end.
            Ok(job) => drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))),
            Err(_) => return,
        }
    }
}

#[cfg(target_os = "linux")]
fn lower_priority() {
    // On Linux the nice value is a thread's own: this thread's id names it.
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), NICE) {
        eprintln!("weir serve: readers run at normal CPU priority: setpriority failed: {e}");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// Runs `call` on a reader thread; `None` if it panicked or no reader
/// thread runs (then the caller answers 500).
pub async fn run<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    start(4);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(call());
    });
    let sent = POOL.get().map(|p| p.lock().unwrap_or_else(|e| e.into_inner()).send(job).is_ok());
    match sent {
        Some(true) => rx.await.ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_read_runs_at_the_lower_priority_and_a_panic_is_none() {
        start(2);
        #[cfg(target_os = "linux")]
        {
            let nice = run(|| rustix::process::getpriority_process(Some(rustix::thread::gettid())).ok()).await;
            assert_eq!(nice, Some(Some(NICE)));
        }
        let panicked: Option<u32> = run(|| panic!("a read that fails")).await;
        assert_eq!(panicked, None);
        assert_eq!(run(|| 7).await, Some(7), "the thread goes on after a panic");
    }
}

//! The receiver a `destination-down` drill delivers to (see `drills`).
//!
//! A drill's rows must never reach a real destination, so the shadow's
//! destinations deliver to this receiver instead, on 127.0.0.1 inside the
//! server: the same names and batch sizes, as `http` destinations. It
//! applies each `Idempotency-Key` once, as SPEC.md 11 asks of a receiver,
//! and while the drill holds it down it answers every delivery
//! `503 Service Unavailable`, which a destination retries with backoff.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use weir_runtime::lock;

/// What the receiver was sent.
#[derive(Default)]
pub(crate) struct Received {
    /// While set, every delivery is answered 503.
    pub down: AtomicBool,
    /// Deliveries answered 503.
    pub refused: AtomicU64,
    /// Batches applied (their key seen for the first time), and their lines.
    pub applied_batches: AtomicU64,
    pub applied_lines: AtomicU64,
    /// Batches sent again after they were applied: acknowledged, not applied.
    pub repeated: AtomicU64,
    keys: Mutex<HashSet<String>>,
}

impl Received {
    pub fn describe(&self) -> Value {
        json!({
            "refused": self.refused.load(Ordering::SeqCst),
            "applied_batches": self.applied_batches.load(Ordering::SeqCst),
            "applied_changes": self.applied_lines.load(Ordering::SeqCst),
            "repeated_batches": self.repeated.load(Ordering::SeqCst),
        })
    }
}

/// The receiver, serving until dropped.
pub(crate) struct StandIn {
    pub addr: SocketAddr,
    pub received: Arc<Received>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl StandIn {
    /// Starts it on a free port of 127.0.0.1, served on `runtime`.
    pub fn start(runtime: &tokio::runtime::Handle) -> weir_runtime::Result<StandIn> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Received::default());
        let routes = Router::new().route("/{destination}", post(receive)).with_state(Arc::clone(&received));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        runtime.spawn(async move {
            let served = match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => axum::serve(listener, routes)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .map_err(weir_runtime::Error::from),
                Err(e) => Err(e.into()),
            };
            if let Err(e) = served {
                eprintln!("weir: a drill's stand-in destination stopped serving: {e}");
            }
        });
        Ok(StandIn { addr, received, stop: Some(stop) })
    }

    pub fn url(&self, destination: &str) -> String {
        format!("http://{}/{destination}", self.addr)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn receive(State(r): State<Arc<Received>>, headers: HeaderMap, body: Bytes) -> (StatusCode, &'static str) {
    if r.down.load(Ordering::SeqCst) {
        r.refused.fetch_add(1, Ordering::SeqCst);
        return (StatusCode::SERVICE_UNAVAILABLE, "the destination is down for a drill");
    }
    let Some(key) = headers.get("idempotency-key").and_then(|k| k.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "no Idempotency-Key");
    };
    if lock(&r.keys).insert(key.to_owned()) {
        let lines = body.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count() as u64;
        r.applied_batches.fetch_add(1, Ordering::SeqCst);
        r.applied_lines.fetch_add(lines, Ordering::SeqCst);
    } else {
        r.repeated.fetch_add(1, Ordering::SeqCst);
    }
    (StatusCode::OK, "")
}

//! The change feed (SPEC.md 7): `GET .../changes` followed instead of
//! polled.
//!
//! - `?since=N&wait=D` (D at most 60 s) answers as soon as the stream has a
//!   change at or after `N`, or empty once `D` has passed (or the server
//!   stops), with `Weir-Next` as any page.
//! - `Accept: text/event-stream`: server-sent events, one per change, `id:`
//!   its `seq`, `data:` the line `/changes` serves; a client that
//!   reconnects with `Last-Event-ID: S` goes on from `S + 1` (else from
//!   `since`). A comment every 15 s keeps idle connections open; the
//!   stream ends when the server stops.
//!
//! A follower waits on its pipeline's bell (a checkpoint or an action on
//! this server rings it) and reads the store again at least every
//! [`Bell::POLL`] where other workers commit too (Kafka). At most
//! `max_followers` feeds are open at once; the next is answered 503 with
//! `Retry-After`. Neither holds a reader's place of the GET gate while it
//! waits (`http::gate` lets them through).

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use weir_runtime::bell::Bell;
use weir_runtime::Pipeline;

use crate::app::*;

/// The longest a long poll may wait.
pub const MAX_WAIT_MS: i64 = 60_000;
/// Changes read from the store at once for a stream of events.
const READ: i64 = 1_000;

/// Whether a request for `/changes` asks for server-sent events.
pub fn wants_events(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/event-stream"))
}

/// Whether a request is a follower's (a long poll or events), which waits
/// outside the GET gate.
pub fn is_follower(path: &str, query: Option<&str>, headers: &HeaderMap) -> bool {
    path.ends_with("/changes")
        && (wants_events(headers) || query.is_some_and(|q| q.split('&').any(|kv| kv.starts_with("wait="))))
}

/// Refused: every place among the open feeds is taken (503, `Retry-After`).
pub(crate) struct Busy(usize);

impl IntoResponse for Busy {
    fn into_response(self) -> Response {
        let why = format!(
            "{} change feeds are open (max_followers in weir.toml); try again in a second, or poll without wait",
            self.0
        );
        let mut r = ApiError(StatusCode::SERVICE_UNAVAILABLE, why).into_response();
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        r
    }
}

/// A place among the open feeds, held while the feed is open.
fn follower_place(app: &App) -> Result<tokio::sync::OwnedSemaphorePermit, Busy> {
    Arc::clone(&app.followers).try_acquire_owned().map_err(|_| Busy(app.config.max_followers))
}

/// How long to wait for a ring before reading the store again.
fn poll(p: &Pipeline) -> Duration {
    if p.on_kafka {
        Bell::POLL
    } else {
        Duration::from_secs(5)
    }
}

/// `?wait=`: the changes from `since`, once there is one, or none after `wait_ms`.
pub(crate) async fn long_poll(
    app: Arc<App>,
    name: String,
    (version, since, limit, wait_ms): (Option<u32>, i64, usize, i64),
    path: &str,
    q: &BTreeMap<String, String>,
) -> Response {
    let p = match pipeline(&app, &name) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let _place = match follower_place(&app) {
        Ok(place) => place,
        Err(busy) => return busy.into_response(),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms as u64);
    let mut closing = app.closing.subscribe();
    loop {
        let rung = p.bell.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        let n = name.clone();
        let rows = match read_stored(p, move |s| s.changes(&n, version, since, limit as i64 + 1)).await {
            Ok(rows) => rows,
            Err(e) => return e.into_response(),
        };
        if !rows.is_empty() || tokio::time::Instant::now() >= deadline || *closing.borrow() {
            return page_by_seq(rows, limit, path, q);
        }
        let wake = (tokio::time::Instant::now() + poll(p)).min(deadline);
        tokio::select! {
            () = &mut rung => {}
            () = tokio::time::sleep_until(wake) => {}
            _ = closing.changed() => {}
        }
    }
}

/// Where an event stream starts: after `Last-Event-ID`, else at `since`.
pub fn start_of(headers: &HeaderMap, since: i64) -> Result<i64, ApiError> {
    match headers.get("last-event-id") {
        None => Ok(since),
        Some(v) => v.to_str().ok().and_then(|s| s.trim().parse::<i64>().ok()).map(|s| s + 1).ok_or_else(|| {
            ApiError(StatusCode::BAD_REQUEST, "Last-Event-ID must be the seq of the last event received".into())
        }),
    }
}

/// What an event stream holds between polls.
struct Following {
    app: Arc<App>,
    name: String,
    version: Option<u32>,
    next: i64,
    ready: VecDeque<(i64, String)>,
    closing: tokio::sync::watch::Receiver<bool>,
    _place: tokio::sync::OwnedSemaphorePermit,
}

/// `Accept: text/event-stream`: every change from `from` on, as it is published.
pub(crate) fn events(app: Arc<App>, name: String, version: Option<u32>, from: i64) -> Response {
    let place = match follower_place(&app) {
        Ok(place) => place,
        Err(busy) => return busy.into_response(),
    };
    let closing = app.closing.subscribe();
    let state = Following { app, name, version, next: from, ready: VecDeque::new(), closing, _place: place };
    let stream = futures_util::stream::unfold(state, |mut f| async move {
        let (seq, line) = next_change(&mut f).await?;
        Some((Ok::<Event, Infallible>(Event::default().id(seq.to_string()).data(line)), f))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

/// The next change of a stream of events, waiting for it; `None` once the
/// server stops or the store cannot be read.
async fn next_change(f: &mut Following) -> Option<(i64, String)> {
    loop {
        if let Some(next) = f.ready.pop_front() {
            return Some(next);
        }
        if *f.closing.borrow() {
            return None;
        }
        let p = pipeline(&f.app, &f.name).ok()?;
        let rung = p.bell.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        let (n, version, since) = (f.name.clone(), f.version, f.next);
        let rows = match read_stored(p, move |s| s.changes(&n, version, since, READ)).await {
            Ok(rows) => rows,
            Err(e) => {
                eprintln!("weir: {}: a change feed ends: {}", f.name, e.1);
                return None;
            }
        };
        for line in rows {
            if let Some(seq) = seq_of(&line) {
                f.next = seq + 1;
                f.ready.push_back((seq, line));
            }
        }
        if !f.ready.is_empty() {
            continue;
        }
        tokio::select! {
            () = &mut rung => {}
            () = tokio::time::sleep(poll(p)) => {}
            _ = f.closing.changed() => {}
        }
    }
}

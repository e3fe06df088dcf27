//! Events in and out of a topic: `POST /v1/topics/{topic}/events` (the
//! whole body checked before anything is appended; answered once durable,
//! in the embedded log or in Kafka) and `GET` of the raw records, for
//! raw-readers (the embedded log only: 409 for a Kafka topic).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use sha2::Digest;
use weir_engine::intake::BodyError;
use weir_engine::time::format_rfc3339_ms;
use weir_log::{LogError, Records};
use weir_runtime::lock;
use weir_store::idempotency::Found;

use crate::app::*;

/// A body refused before anything was appended, with what a refusal names:
/// the topic and its `max_event_bytes`.
pub(crate) struct RefusedBody<'a> {
    pub error: BodyError,
    pub topic: &'a str,
    pub max_event_bytes: usize,
}

impl From<RefusedBody<'_>> for ApiError {
    fn from(refused: RefusedBody<'_>) -> ApiError {
        let RefusedBody { error, topic, max_event_bytes } = refused;
        match error {
            BodyError::TooLong { line, bytes } => ApiError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "line {line} is {bytes} bytes, over max_event_bytes = {max_event_bytes} for topic {topic:?}; nothing was appended; split the event or raise [topics.{topic}] max_event_bytes in weir.toml"
                ),
            ),
            BodyError::NotUtf8 { line } => ApiError(
                StatusCode::BAD_REQUEST,
                format!("line {line} is not UTF-8 text; nothing was appended; send JSON lines encoded as UTF-8"),
            ),
            BodyError::NotJson { line, why } => ApiError(
                StatusCode::BAD_REQUEST,
                format!("line {line} is not JSON ({why}); nothing was appended; send one JSON object per line"),
            ),
            BodyError::NotObject { line, what } => ApiError(
                StatusCode::BAD_REQUEST,
                format!("line {line} is {what}, not a JSON object; nothing was appended; an event is a JSON object, one per line"),
            ),
            BodyError::Reserved { line } => ApiError(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("line {line} is refused: {}; nothing was appended", weir_engine::intake::reserved_why()),
            ),
            BodyError::TooMany { max } => ApiError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body has more than max_events_per_request = {max} events in weir.toml; nothing was appended; send them in smaller requests"
                ),
            ),
            BodyError::OverLimit { line, why } => ApiError(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "line {line} is refused: {why}; nothing was appended; simplify the event or raise the limit in [topics.{topic}] in weir.toml"
                ),
            ),
        }
    }
}

pub(crate) async fn post_events(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    if !caller.grant.may_produce(&topic) {
        return forbidden(&app, &caller, &format!("append to topic {topic:?}")).into_response();
    }
    let kafka = app.producers.get(&topic).cloned();
    let partitions = match app.log.partitions(&topic) {
        Ok(n) => n,
        Err(_) if kafka.is_some() => 1,
        Err(_) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("no topic {topic:?}: topics are the ones a contract reads or weir.toml names"),
            )
        }
    };
    let tc = app.config.topic(&topic);
    let limits = weir_engine::intake::Limits {
        max_event_bytes: tc.max_event_bytes,
        max_depth: tc.max_depth,
        max_fields: tc.max_fields,
        max_key_bytes: tc.max_key_bytes,
        max_events: app.config.max_events_per_request,
    };
    let events = match weir_engine::intake::parse_body(&body, tc.key.as_deref(), &limits) {
        Ok(events) => events,
        Err(error) => {
            return ApiError::from(RefusedBody { error, topic: &topic, max_event_bytes: tc.max_event_bytes })
                .into_response()
        }
    };
    // Each event's partition and place in the body, which the records are
    // cut from as it arrived; its key kept only for Kafka, which is sent it.
    let mut keys = Vec::with_capacity(events.len());
    let mut spans = Vec::with_capacity(events.len());
    let base = body.as_ptr() as usize;
    for (key, line) in events {
        let partition = match &key {
            Some(k) => (xxhash_rust::xxh3::xxh3_64(k.as_bytes()) % u64::from(partitions)) as u32,
            None => (app.round_robin.fetch_add(1, Ordering::Relaxed) % u64::from(partitions)) as u32,
        };
        // A line is a slice of the body; were it not, `Records::cut` refuses its range.
        let at = (line.as_ptr() as usize).wrapping_sub(base);
        spans.push((partition, at..at.wrapping_add(line.len())));
        keys.push(key.filter(|_| kafka.is_some()).map(Cow::into_owned));
    }
    if spans.is_empty() {
        return error(StatusCode::BAD_REQUEST, "the body has no events: send one JSON object per line");
    }
    let Some(records) = Records::cut(body.clone(), spans) else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "an event's place in the body was lost; nothing was appended");
    };
    let count = records.len();
    // With an Idempotency-Key: at most once (SPEC.md 7).
    let key = match idempotency_key(&headers) {
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
        Ok(None) => return append(&app, &topic, kafka, (records, keys, count), None, Vec::new()).await,
        Ok(Some(key)) => key,
    };
    // A key is the producer's own: another token's same key is another key.
    let scoped = format!("{}/{key}", caller.grant.id);
    let Some(guard) = InFlight::claim(&app, &topic, &scoped) else {
        let mut r = error(
            StatusCode::CONFLICT,
            format!("a request with Idempotency-Key {key:?} is being done now; send it again once it is answered"),
        );
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    };
    // Done to its end on a task of its own, so a client that goes away
    // mid-request leaves its key answered (or free), never `pending`.
    let named = key.clone();
    let keyed = tokio::spawn(async move {
        let (mut records, mut keys) = (records, keys);
        let mut found_before: Vec<(u32, u64)> = Vec::new();
        // Collision-resistant: another body must never pass for this one.
        let hash = weir_store::digest::sha256_hex(&body);
        let starts: Vec<u64> = match kafka {
            Some(_) => Vec::new(),
            None => app.log.bounds(&topic).map(|b| b.iter().map(|x| x.1).collect()).unwrap_or_default(),
        };
        let (t, k, h) = (topic.clone(), scoped, hash);
        let st = starts.clone();
        let found =
            app.on_weir_db(move |c| weir_store::idempotency::begin(c, &t, &k, &h, &st, weir_log::now_ms())).await;
        let other_body = || {
            error(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("Idempotency-Key {key:?} was used for another body in the last 24 hours; nothing was appended; give new events a new key"),
            )
        };
        match found {
            Err(e) => return e.into_response(),
            Ok(Found::New) => {}
            Ok(Found::Done { same_body: true, answer }) => {
                let mut r = ([(header::CONTENT_TYPE, "application/json")], answer).into_response();
                r.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
                return r;
            }
            Ok(Found::Done { same_body: false, .. } | Found::Pending { same_body: false, .. }) => return other_body(),
            Ok(Found::Pending { same_body: true, starts, at_ms }) => {
                // A crash cut the first attempt short: what it appended
                // carries its tag, past `starts` on the log, and on Kafka
                // stamped after it began (a minute's margin for the clock);
                // only the rest is appended now.
                let tag = request_tag(&guard.key.1);
                let wanted: Vec<Vec<u8>> = records.iter().map(|(_, r)| r.to_vec()).collect();
                let (log, t, app2) = (app.log.clone(), topic.clone(), Arc::clone(&app));
                let looked = tokio::task::spawn_blocking(move || match app2.brokers.get(&t) {
                    Some(brokers) => {
                        let since = at_ms.saturating_sub(60_000);
                        let kafka = app2.config.kafka.as_ref();
                        match weir_runtime::kafka::tagged_since(
                            brokers,
                            kafka,
                            &t,
                            since,
                            &weir_store::digest::hex(&tag),
                        ) {
                            Ok(found) => Ok(matched(found, &wanted)),
                            Err(e) => Err(e.to_string()),
                        }
                    }
                    None => already_appended(&log, &t, &starts, tag, &wanted).map_err(|e| e.to_string()),
                })
                .await;
                let at = match looked {
                    Ok(Ok(at)) => at,
                    Ok(Err(why)) => {
                        let mut r = error(
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("an earlier attempt with Idempotency-Key {key:?} was cut short by a restart, and what it appended could not be read ({why}); nothing was appended now; send it again"),
                        );
                        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                        return r;
                    }
                    Err(e) => {
                        return error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("finishing Idempotency-Key {key:?}: {e}"),
                        )
                    }
                };
                // Only what it did not append is left to append.
                found_before.extend(at.iter().flatten());
                records.retain_places(|i| at.get(i).is_some_and(Option::is_none));
                let mut place = 0;
                keys.retain(|_| {
                    place += 1;
                    at.get(place - 1).is_some_and(Option::is_none)
                });
            }
        }
        append(&app, &topic, kafka, (records, keys, count), Some(guard), found_before).await
    });
    keyed.await.unwrap_or_else(|e| {
        error(StatusCode::INTERNAL_SERVER_ERROR, format!("the request with Idempotency-Key {named:?} failed: {e}"))
    })
}

/// Appends `records` (to Kafka or the log) and answers with where they
/// went, keeping the answer under the request's Idempotency-Key
/// (`in_flight`) or freeing the key when nothing was appended; `found_before` are
/// records an earlier attempt with the key already appended.
async fn append(
    app: &Arc<App>,
    topic: &str,
    kafka: Option<rdkafka::producer::FutureProducer>,
    (records, keys, count): (Records, Vec<Option<String>>, usize),
    in_flight: Option<InFlight>,
    found_before: Vec<(u32, u64)>,
) -> Response {
    let arrived = std::time::Instant::now();
    let answer = match (kafka, records.is_empty()) {
        (_, true) => Ok(Vec::new()),
        (Some(producer), false) => {
            let tag = in_flight.as_ref().map(|held| weir_store::digest::hex(&request_tag(&held.key.1)));
            match weir_runtime::kafka::produce(&producer, topic, records.iter().map(|(_, p)| p), &keys, tag.as_deref())
                .await
            {
                Ok(offsets) => Ok(offsets),
                Err(e) => {
                    if let Some(held) = &in_flight {
                        // Not acknowledged: the key is free for the retry (Kafka may
                        // hold part of the batch, which the retry then adds again).
                        let (t, k) = (topic.to_owned(), held.key.1.clone());
                        let _ = app.on_weir_db(move |c| weir_store::idempotency::forget(c, &t, &k)).await;
                    }
                    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, e);
                    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    return r;
                }
            }
        }
        (None, false) => {
            let appended = match &in_flight {
                Some(held) => app.log.append_tagged(topic, records, request_tag(&held.key.1)),
                None => app.log.append(topic, records),
            };
            match appended {
                Ok(pending) => pending.wait().await,
                Err(e) => Err(e),
            }
        }
    };
    if answer.is_ok() {
        lock(&app.durable).observe(arrived.elapsed().as_secs_f64());
    }
    let key = in_flight.as_ref().map(|g| g.key.1.clone());
    match answer {
        Ok(offsets) => {
            let mut ranges: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
            for (p, o) in offsets.into_iter().chain(found_before) {
                let r = ranges.entry(p).or_insert((o, o, 0));
                r.0 = r.0.min(o);
                r.1 = r.1.max(o);
                r.2 += 1;
            }
            let parts: Vec<_> = ranges
                .into_iter()
                .map(|(p, (first, last, n))| serde_json::json!({"partition": p, "first": first, "last": last, "count": n}))
                .collect();
            let answer = serde_json::json!({ "accepted": count, "partitions": parts }).to_string() + "\n";
            if let Some(key) = key {
                let (t, a) = (topic.to_owned(), answer.clone());
                if let Err(e) = app.on_weir_db(move |c| weir_store::idempotency::finish(c, &t, &key, &a)).await {
                    // Durable, but a repeat would not get this answer: say so rather than 200.
                    return e.into_response();
                }
            }
            ([(header::CONTENT_TYPE, "application/json")], answer).into_response()
        }
        Err(e) => {
            if let Some(key) = key {
                // Nothing was appended: the key is free for the retry.
                let t = topic.to_owned();
                let _ = app.on_weir_db(move |c| weir_store::idempotency::forget(c, &t, &key)).await;
            }
            match e {
                LogError::Unavailable(why) => {
                    let mut r = error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("the log cannot write now ({why}); nothing was acknowledged; send again later"),
                    );
                    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    r
                }
                e @ LogError::Busy { .. } => {
                    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
                    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    r
                }
                e => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
    }
}

/// The request's `Idempotency-Key`: 1-128 visible ASCII characters.
fn idempotency_key(headers: &axum::http::HeaderMap) -> Result<Option<String>, String> {
    let Some(v) = headers.get("idempotency-key") else { return Ok(None) };
    let bytes = v.as_bytes();
    if bytes.is_empty() || bytes.len() > 128 || !bytes.iter().all(|b| b.is_ascii_graphic()) {
        return Err("Idempotency-Key must be 1 to 128 visible ASCII characters; nothing was appended".into());
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

/// A key held while its request is done; released when dropped.
struct InFlight {
    app: Arc<App>,
    key: (String, String),
}

impl InFlight {
    fn claim(app: &Arc<App>, topic: &str, key: &str) -> Option<InFlight> {
        let k = (topic.to_owned(), key.to_owned());
        lock(&app.in_flight).insert(k.clone()).then(|| InFlight { app: Arc::clone(app), key: k })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.app.in_flight).remove(&self.key);
    }
}

/// The tag every record of a request with an Idempotency-Key carries (on
/// the log as the record's tag, on Kafka as the `weir-request` header): the
/// first 16 bytes of the SHA-256 of the key as stored (`TOKEN_ID/KEY`).
pub(crate) fn request_tag(scoped_key: &str) -> [u8; weir_log::TAG] {
    let digest = sha2::Sha256::digest(scoped_key.as_bytes());
    let mut tag = [0u8; weir_log::TAG];
    tag.copy_from_slice(&digest[..weir_log::TAG]);
    tag
}

/// Where each of `wanted` already is in the log past `starts` (its
/// partition's end before an attempt a crash cut short), among the records
/// that attempt appended (those carrying its `tag`: another producer's
/// record with the same bytes is not one of them).
fn already_appended(
    log: &weir_log::Log,
    topic: &str,
    starts: &[u64],
    tag: [u8; weir_log::TAG],
    wanted: &[Vec<u8>],
) -> Result<Vec<Option<(u32, u64)>>, LogError> {
    let mut found = Vec::new();
    for (p, &(_, end)) in log.bounds(topic)?.iter().enumerate() {
        let mut from = starts.get(p).copied().unwrap_or(end);
        while from < end {
            let got = log.read(topic, p as u32, from, 10_000, 16 << 20)?;
            let Some(last) = got.last() else { break };
            from = last.offset + 1;
            found.extend(got.into_iter().filter(|r| r.tag == Some(tag)).map(|r| (p as u32, r.offset, r.payload)));
        }
    }
    Ok(matched(found, wanted))
}

/// Each of `wanted` matched to one of the records `found` with its bytes,
/// in order; `None` for those not there.
fn matched(found: Vec<(u32, u64, Vec<u8>)>, wanted: &[Vec<u8>]) -> Vec<Option<(u32, u64)>> {
    let mut there: std::collections::HashMap<Vec<u8>, std::collections::VecDeque<(u32, u64)>> =
        std::collections::HashMap::new();
    for (p, offset, payload) in found {
        there.entry(payload).or_default().push_back((p, offset));
    }
    wanted.iter().map(|w| there.get_mut(&w[..]).and_then(|q| q.pop_front())).collect()
}

/// Raw events: raw-reader tokens only, and every read is in the audit log
/// (`?why=` says why; it is kept).
pub(crate) async fn read_events(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    uri: axum::http::Uri,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    if !caller.grant.may_read_raw(&topic) {
        return Err(forbidden(&app, &caller, &format!("read the events of topic {topic:?}")));
    }
    if app.producers.contains_key(&topic) {
        // The topic's events are in Kafka, not in this server's log: an empty answer would be a lie.
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("topic {topic:?} is on Kafka, not on weir's embedded log; read its events with Kafka's tools"),
        ));
    }
    let partition = param(&q, "partition", 0u32)?;
    let from = param(&q, "from", 0u64)?;
    let limit = page_limit(&q, 1000)?;
    let log = app.log.clone();
    let t = topic.to_owned();
    let read = tokio::task::spawn_blocking(move || {
        let records = log.read(&t, partition, from, limit, 64 << 20)?;
        let end = log.bounds(&t)?.get(partition as usize).map_or(0, |b| b.1);
        Ok::<_, LogError>((records, end))
    })
    .await;
    let (records, end) = match read {
        Ok(Ok(records)) => records,
        Ok(Err(e @ (LogError::NoTopic(_) | LogError::NoPartition { .. }))) => {
            return Err(ApiError(StatusCode::NOT_FOUND, e.to_string()))
        }
        Ok(Err(e)) => return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        Err(e) => return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    };
    let detail = serde_json::json!({
        "topic": topic, "partition": partition, "from": from, "limit": limit, "returned": records.len(),
    });
    audited(&app, &caller, "raw-read", None, detail, why_of(&q)).await?;
    // More past this page: the partition goes on after its last record
    // (a page is cut at `limit` records or 64 MiB).
    let next = records
        .last()
        .map(|r| r.offset + 1)
        .filter(|n| *n < end)
        .map(|n| next_page(uri.path(), &q, ("from", n.to_string())));
    let mut body = String::new();
    for r in records {
        body.push_str(&format!(
            "{{\"partition\":{},\"offset\":{},\"append_time\":\"{}\",\"event\":",
            r.partition,
            r.offset,
            format_rfc3339_ms(r.append_ms)
        ));
        body.push_str(&String::from_utf8_lossy(&r.payload));
        body.push_str("}\n");
    }
    let mut r = lines(body);
    if let Some(v) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert(NEXT, v);
    }
    Ok(r)
}

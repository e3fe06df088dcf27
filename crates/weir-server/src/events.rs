//! Events in and out of a topic: `POST /v1/topics/{topic}/events` (the
//! whole body checked before anything is appended; answered once durable,
//! in the embedded log or in Kafka) and `GET` of the raw records, for
//! raw-readers (the embedded log only: 409 for a Kafka topic).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use weir_engine::time::format_rfc3339_ms;
use weir_log::LogError;
use weir_runtime::lock;

use crate::app::*;

pub(crate) async fn post_events(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
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
        Err(weir_engine::intake::BodyError::TooLong { line, bytes }) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "line {line} is {bytes} bytes, over max_event_bytes = {} for topic {topic:?}; nothing was appended; split the event or raise [topics.{topic}] max_event_bytes in weir.toml",
                    tc.max_event_bytes
                ),
            )
        }
        Err(weir_engine::intake::BodyError::NotUtf8 { line }) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("line {line} is not UTF-8 text; nothing was appended; send JSON lines encoded as UTF-8"),
            )
        }
        Err(weir_engine::intake::BodyError::NotJson { line, why }) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("line {line} is not JSON ({why}); nothing was appended; send one JSON value per line"),
            )
        }
        Err(weir_engine::intake::BodyError::NotObject { line, what }) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("line {line} is {what}, not a JSON object; nothing was appended; an event is a JSON object, one per line"),
            )
        }
        Err(weir_engine::intake::BodyError::Reserved { line }) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("line {line} is refused: {}; nothing was appended", weir_engine::intake::reserved_why()),
            )
        }
        Err(weir_engine::intake::BodyError::TooMany { max }) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body has more than max_events_per_request = {max} events in weir.toml; nothing was appended; send them in smaller requests"
                ),
            )
        }
        Err(weir_engine::intake::BodyError::OverLimit { line, why }) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "line {line} is refused: {why}; nothing was appended; simplify the event or raise the limit in [topics.{topic}] in weir.toml"
                ),
            )
        }
    };
    let mut keys = Vec::with_capacity(events.len());
    let mut records = Vec::with_capacity(events.len());
    for (key, line) in events {
        let partition = match &key {
            Some(k) => (xxhash_rust::xxh3::xxh3_64(k.as_bytes()) % u64::from(partitions)) as u32,
            None => (app.round_robin.fetch_add(1, Ordering::Relaxed) % u64::from(partitions)) as u32,
        };
        records.push((partition, line.to_vec()));
        keys.push(key);
    }
    if records.is_empty() {
        return error(StatusCode::BAD_REQUEST, "the body has no events: send one JSON value per line");
    }
    let count = records.len();
    let arrived = std::time::Instant::now();
    let answer = match kafka {
        Some(producer) => match weir_runtime::kafka::produce(&producer, &topic, &records, &keys).await {
            Ok(offsets) => Ok(offsets),
            Err(e) => {
                let mut r = error(StatusCode::SERVICE_UNAVAILABLE, e);
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            }
        },
        None => match app.log.append(&topic, records) {
            Ok(pending) => pending.wait().await,
            Err(e) => Err(e),
        },
    };
    if answer.is_ok() {
        lock(&app.durable).observe(arrived.elapsed().as_secs_f64());
    }
    match answer {
        Ok(offsets) => {
            let mut ranges: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
            for (p, o) in offsets {
                let r = ranges.entry(p).or_insert((o, o, 0));
                r.0 = r.0.min(o);
                r.1 = r.1.max(o);
                r.2 += 1;
            }
            let parts: Vec<_> = ranges
                .into_iter()
                .map(|(p, (first, last, n))| serde_json::json!({"partition": p, "first": first, "last": last, "count": n}))
                .collect();
            json(serde_json::json!({ "accepted": count, "partitions": parts }))
        }
        Err(LogError::Unavailable(why)) => {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the log cannot write now ({why}); nothing was acknowledged; send again later"),
            );
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        Err(e @ LogError::Busy { .. }) => {
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
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
    let t = topic.clone();
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

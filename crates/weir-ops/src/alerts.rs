//! Alerts from the contracts' `[alerts]` sections, evaluated every second.
//!
//! An alert fires when its observed value passes the threshold and resolves
//! when the value comes back; each change is a notification POSTed as JSON
//! to the contract's `webhook` (else weir.toml's `alert_webhook`), retried
//! with backoff on that webhook's own queue and thread
//! ([`crate::webhooks`]), so delivery never blocks processing, and a dead
//! hook delays no other.
//! Firing alerts are shown by `status`.
//!
//! Observed values: `max_lag` the log time between the oldest record not yet
//! read and the newest record (per partition, the largest);
//! `max_watermark_age` now minus the watermark; `max_oldest_unprocessed` now
//! minus the append time of the oldest record not yet read;
//! `max_ledger_rate` ledger entries per event read over the last minute;
//! `max_corrected_windows` the windows corrected by backfill runs (operator
//! or scheduled) that finished in the last hour; `max_destination_lag` the
//! age of the oldest change a destination has not taken (the largest over
//! its destinations). One alert needs no
//! `[alerts]`: `offsets_skipped` fires while offsets of the input were
//! skipped in the last hour (deleted by retention, or by Kafka's, before the
//! pipeline read them: those events never counted and are in no ledger).

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_contract::Alerts;
use weir_engine::time::format_rfc3339_ms;

use crate::report::{report, Report};
use crate::watch::Firing;
use crate::Ops;
use weir_runtime::lock;

pub struct Check {
    pub alert: &'static str,
    /// Observed and threshold, comparable.
    pub observed: f64,
    pub threshold: f64,
    pub show: fn(f64) -> String,
    pub question: String,
}

fn ms(v: f64) -> String {
    weir_contract::format_duration_ms(v.max(0.0) as i64)
}

fn ratio(v: f64) -> String {
    format!("{v:.4}")
}

/// Ledger entries per event read between two samples of (read, ledgered);
/// none when nothing was read. Counts go back when a partition is handed
/// over, so a difference is never taken below zero.
pub fn ledger_rate((r0, l0): (u64, u64), (r1, l1): (u64, u64)) -> Option<f64> {
    (r1 > r0).then(|| l1.saturating_sub(l0) as f64 / (r1 - r0) as f64)
}

pub fn checks(
    alerts: &Alerts,
    status: &Report,
    ledger_rate: Option<f64>,
    corrected_last_hour: Option<u64>,
    skipped_last_hour: u64,
) -> Vec<Check> {
    let mut out = vec![Check {
        alert: "offsets_skipped",
        observed: skipped_last_hour as f64,
        threshold: 0.0,
        show: count,
        question: "Which events were deleted before the pipeline read them? Retention (or Kafka's) removed offsets it had not read: they counted nowhere; backfill the windows from the system of record, or keep the input longer.".into(),
    }];
    if let (Some(t), v) = (alerts.max_lag_ms, status.lag_ms as f64) {
        out.push(Check {
            alert: "max_lag",
            observed: v,
            threshold: t as f64,
            show: ms,
            question: "Is the pipeline keeping up with the log, or did a burst of events arrive?".into(),
        });
    }
    if let Some(t) = alerts.max_watermark_age_ms {
        // No watermark yet counts as infinitely old only once events were read.
        let v = status.watermark_age_ms.map(|v| v as f64).or_else(|| (status.events.read > 0).then_some(f64::MAX));
        if let Some(v) = v {
            out.push(Check {
                alert: "max_watermark_age",
                observed: v,
                threshold: t as f64,
                show: ms,
                question: "Has a source or partition stopped sending, or are event times far behind the clock?".into(),
            });
        }
    }
    if let (Some(t), v) = (alerts.max_oldest_unprocessed_ms, status.oldest_unprocessed_age_ms as f64) {
        out.push(Check {
            alert: "max_oldest_unprocessed",
            observed: v,
            threshold: t as f64,
            show: ms,
            question: "Is the pipeline stuck or paused while events wait in the log?".into(),
        });
    }
    if let (Some(t), Some(v)) = (alerts.max_ledger_rate, ledger_rate) {
        out.push(Check {
            alert: "max_ledger_rate",
            observed: v,
            threshold: t,
            show: ratio,
            question: "Did a producer change its event format, or start resending?".into(),
        });
    }
    if let (Some(t), Some(d)) = (
        alerts.max_destination_lag_ms,
        status.destinations.iter().max_by(|a, b| a.lag_seconds.total_cmp(&b.lag_seconds)),
    ) {
        out.push(Check {
            alert: "max_destination_lag",
            observed: d.lag_seconds * 1000.0,
            threshold: t as f64,
            show: ms,
            question: format!(
                "Why has destination {} not taken the changes of the last {}? It is {}{}.",
                d.name,
                ms(d.lag_seconds * 1000.0),
                d.state,
                d.last_error.as_deref().map(|e| format!("; its last error: {e}")).unwrap_or_default()
            ),
        });
    }
    if let (Some(t), Some(n)) = (alerts.max_corrected_windows, corrected_last_hour) {
        out.push(Check {
            alert: "max_corrected_windows",
            observed: n as f64,
            threshold: t as f64,
            show: count,
            question: format!(
                "Why did {n} windows need correcting in the last hour? The backfill reports (GET .../backfills) name the causes the ledger holds: late events, duplicates, corrections."
            ),
        });
    }
    out
}

/// The notification of an alert's change (`firing`, `resolved`), as the webhook gets it.
pub fn notification(
    what: &str,
    c: &Check,
    (name, pipeline): (&str, &weir_contract::Pipeline),
    since_ms: i64,
    now: i64,
) -> serde_json::Value {
    serde_json::json!({
        "status": what,
        "alert": c.alert,
        "pipeline": name,
        "version": pipeline.version,
        "owner": pipeline.owner,
        "steward": pipeline.steward,
        "decision": pipeline.decision,
        "threshold": (c.show)(c.threshold),
        "observed": (c.show)(c.observed),
        "question": c.question,
        "since": format_rfc3339_ms(since_ms),
        "at": format_rfc3339_ms(now),
    })
}

fn count(v: f64) -> String {
    format!("{}", v.max(0.0) as u64)
}

/// Every second, forever: samples every pipeline for the dashboard's
/// charts and evaluates its alerts.
pub async fn run(app: Arc<Ops>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let a = Arc::clone(&app);
        let _ = tokio::task::spawn_blocking(move || evaluate(&a)).await;
        // Notifications about versions carry a diff: written off this loop.
        let asked = std::mem::take(&mut lock(&app.versions).asked);
        for (name, event, switch) in asked {
            crate::versions::notify(&app, &name, event, switch);
        }
    }
}

/// Queues `note` on its webhook's own queue (see [`crate::webhooks`]); a
/// full queue drops its oldest, which is logged and counted.
pub fn notify(app: &Ops, url: &str, note: serde_json::Value) {
    let capacity = app.config.alert_queue;
    let allow = weir_runtime::outbound::Allow {
        private: app.config.allow_private_webhooks,
        link_local: app.config.allow_link_local_webhooks,
    };
    if let Some(dropped) = app.webhooks.send(url, note, capacity, allow) {
        eprintln!(
            "weir: alert notification dropped: {capacity} notifications wait for {url} (weir.toml alert_queue): {dropped}"
        );
    }
}

fn evaluate(app: &Ops) {
    let now = weir_log::now_ms();
    // Versions: candidates that caught up, automatic promotes, and the notifications of both.
    let waiting = std::mem::take(&mut *lock(&app.notes));
    for (name, note) in crate::versions::check(app).into_iter().chain(waiting) {
        let Some(p) = app.pipelines.get(&name) else { continue };
        if let Err(e) = p.store.record_notification(&name, now, &note.to_string()) {
            eprintln!("weir: version notification not kept in the store ({e}): {note}");
        }
        let webhook = p.contract().alerts.as_ref().and_then(|a| a.webhook.clone());
        if let Some(url) = webhook.or_else(|| app.config.alert_webhook.clone()) {
            notify(app, &url, note);
        }
    }
    for (name, p) in &app.pipelines {
        let status = report(&app.log, &app.watch, name, p);
        crate::watch::record(&app.watch, name, status.events.read, status.lag_records, status.watermark_age_ms);
        crate::watch::refresh_reconcile(&app.watch, name, p.store.as_ref());
        let no_alerts = Alerts::default();
        let alerts = p.contract().alerts.as_ref().unwrap_or(&no_alerts);
        let corrected_last_hour = lock(&app.watch.reconcile).get(name).map(|t| t.corrected_last_hour);
        let (read, ledger) = (status.events.read, status.ledgered());
        let rate = {
            let mut state = lock(&app.watch.alerts);
            let h = state.history.entry(name.clone()).or_default();
            h.push_back((Instant::now(), read, ledger));
            while h.len() > 2 && h.front().is_some_and(|(t, _, _)| t.elapsed() > Duration::from_secs(60)) {
                h.pop_front();
            }
            let (first, last) = (h.front().copied(), h.back().copied());
            match (first, last) {
                (Some((_, r0, l0)), Some((_, r1, l1))) => ledger_rate((r0, l0), (r1, l1)),
                _ => None,
            }
        };
        let skipped = lock(&app.watch.alerts)
            .skipped
            .entry(name.clone())
            .or_default()
            .observe(status.offsets_not_delivered, Instant::now());
        let webhook = alerts.webhook.clone().or_else(|| app.config.alert_webhook.clone());
        let mut state = lock(&app.watch.alerts);
        let firing = state.firing.entry(name.clone()).or_default();
        let mut notes = Vec::new();
        for c in checks(alerts, &status, rate, corrected_last_hour, skipped) {
            let over = c.observed > c.threshold;
            let at = firing.iter().position(|f| f.alert == c.alert);
            let change = match (over, at) {
                (true, None) => {
                    firing.push(Firing {
                        alert: c.alert,
                        threshold: (c.show)(c.threshold),
                        observed: (c.show)(c.observed),
                        since_ms: now,
                    });
                    Some(("firing", firing.len() - 1))
                }
                (true, Some(i)) => {
                    firing[i].observed = (c.show)(c.observed);
                    None
                }
                (false, Some(i)) => Some(("resolved", i)),
                (false, None) => None,
            };
            let Some((what, i)) = change else { continue };
            let f = firing[i].clone();
            if what == "resolved" {
                firing.remove(i);
            }
            let note = notification(what, &c, (name, &p.contract().pipeline), f.since_ms, now);
            eprintln!(
                "weir: alert {what}: {name} {} observed {} (threshold {})",
                c.alert,
                (c.show)(c.observed),
                f.threshold
            );
            notes.push(note);
        }
        drop(state);
        // The webhook first: a store that waits for its write lock (up to
        // its busy timeout) holds up no one who is told.
        let tell = |notes: &[serde_json::Value]| {
            if let Some(url) = &webhook {
                for note in notes {
                    notify(app, url, note.clone());
                }
            }
        };
        tell(&notes);
        for note in &notes {
            if let Err(e) = raise_or_mitigate(p.store.as_ref(), name, note) {
                eprintln!("weir: alert not kept in an incident ({e}): {note}");
            }
        }
        // The named checks raise and mitigate their incidents as they are judged.
        let checked = crate::checks::evaluate(app, name, p, &status, now);
        tell(&checked);
        notes.extend(checked);
        for note in notes {
            // Kept in the pipeline's store, so the incident list outlives a restart.
            if let Err(e) = p.store.record_notification(name, now, &note.to_string()) {
                eprintln!("weir: alert notification not kept in the store ({e}): {note}");
            }
        }
    }
}

/// A firing alert opens an incident (`alert:NAME`), or goes in the
/// timeline of the one it opened before that is not resolved; a resolved
/// alert goes in that timeline and makes it mitigated. Resolving it takes
/// an operator and a proof.
fn raise_or_mitigate(store: &dyn weir_store::Store, name: &str, note: &serde_json::Value) -> weir_store::Result<()> {
    let text = |k: &str| note[k].as_str().unwrap_or_default().to_owned();
    let cause = format!("alert:{}", text("alert"));
    let seen = format!(
        "{} {}: observed {} (threshold {})",
        text("alert"),
        text("status"),
        text("observed"),
        text("threshold")
    );
    if note["status"] == "firing" {
        let title = format!("{} firing on {name}: {}", text("alert"), text("question"));
        store.raise_incident(name, &cause, (&title, &text("owner")), &seen)?;
    } else {
        store.mark_incidents(name, Some(&cause), ("alert", "weir", &seen), true)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_11_the_ledger_rate_survives_counts_that_go_back_after_a_rebalance() {
        assert_eq!(ledger_rate((100, 10), (200, 30)), Some(0.2));
        // A partition handed over: the worker's ledger count falls below the earlier sample.
        assert_eq!(ledger_rate((100, 40), (150, 5)), Some(0.0));
        assert_eq!(ledger_rate((100, 10), (100, 30)), None, "nothing read: no rate");
        assert_eq!(ledger_rate((200, 10), (150, 30)), None, "read went back: no rate");
    }

    #[test]
    fn point_12_skipped_offsets_are_counted_for_an_hour_and_survive_a_count_going_back() {
        let t0 = Instant::now();
        let mut s = crate::watch::Skipped::default();
        assert_eq!(s.observe(0, t0), 0);
        assert_eq!(s.observe(40, t0 + Duration::from_secs(1)), 40);
        assert_eq!(s.observe(40, t0 + Duration::from_secs(60)), 40, "still within the hour");
        // A restart: the count starts again from 0, and 5 more are skipped.
        assert_eq!(s.observe(0, t0 + Duration::from_secs(61)), 40);
        assert_eq!(s.observe(5, t0 + Duration::from_secs(62)), 45);
        assert_eq!(s.observe(5, t0 + Duration::from_secs(62 + 3601)), 0, "an hour without a skip resolves it");
    }
}

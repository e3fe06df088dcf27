//! Latency histograms for `/metrics`, in Prometheus' cumulative form.
//!
//! In more detail: latency histograms (processing, POST to durable, checkpoint
//! duration, producer lag: an event's time to its append, from the log's append
//! time or Kafka's timestamp less `Engine::last_event_time`) in Prometheus'
//! cumulative form.

/// Upper bounds of the buckets, in seconds.
pub const BOUNDS: [f64; 14] = [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0];

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is above every bound.
    pub counts: [u64; BOUNDS.len() + 1],
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn observe(&mut self, seconds: f64) {
        let i = BOUNDS.iter().position(|&b| seconds <= b).unwrap_or(BOUNDS.len());
        self.counts[i] += 1;
        self.sum += seconds;
        self.count += 1;
    }

    /// The exposition lines: `_bucket{le=..}` cumulative, `_sum`, `_count`.
    pub fn lines(&self, name: &str, labels: &str) -> Vec<String> {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut out = Vec::new();
        let mut running = 0;
        for (i, bound) in BOUNDS.iter().map(|b| b.to_string()).chain(["+Inf".to_owned()]).enumerate() {
            running += self.counts[i];
            out.push(format!("{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {running}"));
        }
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        out.push(format!("{name}_sum{braces} {}", self.sum));
        out.push(format!("{name}_count{braces} {}", self.count));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let mut h = Histogram::default();
        for s in [0.0005, 0.003, 0.003, 100.0] {
            h.observe(s);
        }
        let lines = h.lines("x", "p=\"a\"");
        assert_eq!(lines[0], "x_bucket{p=\"a\",le=\"0.001\"} 1");
        assert_eq!(lines[2], "x_bucket{p=\"a\",le=\"0.005\"} 3");
        assert_eq!(lines[BOUNDS.len()], "x_bucket{p=\"a\",le=\"+Inf\"} 4");
        assert_eq!(lines.last().map(String::as_str), Some("x_count{p=\"a\"} 4"));
    }
}

//! Prometheus metrics shared by every front door: HTTP request counts and latencies per route and
//! status, and the counters other front doors register (DHCP packets, drops, latencies). Exported
//! at `/metrics` by the HTTP front door. Imports no front door.
//!
//! [`AtomicHistogram`] is for hot paths that must never wait (DHCP, the group commit): an
//! observation is three relaxed atomic additions. `prometheus_client`'s `Histogram` takes a write
//! lock per observation, which a scrape holds too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of an HTTP request. Every value comes from a closed set, whatever a client sends: a
/// method outside RFC 9110's registry is `other`, a path that matched no route is `other`, so an
/// anonymous client cannot grow the metric families (or a scrape of `/metrics`) without bound.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Method: one of [`METHODS`] or `other`.
    pub method: &'static str,
    /// Route template (never the raw path: ids would explode cardinality), or `other`.
    pub route: String,
    /// Status code.
    pub status: u16,
}

/// The methods counted by name (RFC 9110 section 9 and PATCH, RFC 5789); any other is `other`.
pub const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE",
];

/// The label of a route no route template matched.
pub const OTHER: &str = "other";

impl RequestLabels {
    /// Labels of a request: `method` as sent (any bytes), `route` a route template the server
    /// names (never a raw path) or `None` when nothing matched, and the answer's `status`.
    pub fn new(method: &str, route: Option<&str>, status: u16) -> Self {
        RequestLabels {
            method: METHODS
                .iter()
                .find(|m| **m == method)
                .copied()
                .unwrap_or(OTHER),
            route: route.unwrap_or(OTHER).to_string(),
            status,
        }
    }
}

/// The registry and the HTTP metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// HTTP requests by method, route and status.
    pub requests: Family<RequestLabels, Counter>,
    /// HTTP latency by method, route and status.
    pub latency: Family<RequestLabels, Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with the HTTP metrics registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("plinth");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        registry.register("http_requests", "HTTP requests served", requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency",
            latency.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            requests,
            latency,
        }
    }

    /// Register more metrics (other front doors).
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        if let Ok(mut r) = self.registry.lock() {
            r.register(name, help, metric);
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(r) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        }
        out
    }
}

/// A histogram whose `observe` is lock-free: fixed bucket bounds, a count per bucket, a total
/// count and a sum, all relaxed atomics (a scrape may see an observation half recorded, off by
/// one between buckets and count; never a torn number). Values are recorded in integer units, `per`
/// of them to the exported unit (a million for durations in seconds: microseconds), so the sum is
/// an atomic integer too.
#[derive(Clone, Debug)]
pub struct AtomicHistogram {
    inner: Arc<HistogramInner>,
}

#[derive(Debug)]
struct HistogramInner {
    /// Upper bounds, in units, ascending; one more bucket (+Inf) follows.
    bounds: Vec<u64>,
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    sum: AtomicU64,
    per: f64,
}

impl AtomicHistogram {
    /// Buckets with upper bounds `bounds` (in units, `per` of them to the exported unit,
    /// ascending) and +Inf.
    pub fn new(bounds: Vec<u64>, per: f64) -> Self {
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        AtomicHistogram {
            inner: Arc::new(HistogramInner {
                bounds,
                counts,
                count: AtomicU64::new(0),
                sum: AtomicU64::new(0),
                per,
            }),
        }
    }

    /// Durations in seconds, buckets from 50 µs doubling to about 13 s (19 buckets).
    pub fn seconds() -> Self {
        Self::new((0..19).map(|i| 50u64 << i).collect(), 1e6)
    }

    /// Counts (batch sizes): 1, 2, 4, ... 4096.
    pub fn sizes() -> Self {
        Self::new((0..13).map(|i| 1u64 << i).collect(), 1.0)
    }

    /// Record `units`.
    pub fn observe_units(&self, units: u64) {
        let i = self.inner.bounds.partition_point(|b| *b < units);
        if let Some(c) = self.inner.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.count.fetch_add(1, Ordering::Relaxed);
        self.inner.sum.fetch_add(units, Ordering::Relaxed);
    }

    /// Record a duration (a histogram made by [`AtomicHistogram::seconds`]).
    pub fn observe_duration(&self, d: Duration) {
        self.observe_units(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.inner.count.load(Ordering::Relaxed)
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = &self.inner;
        let buckets: Vec<(f64, u64)> = h
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let bound = h.bounds.get(i).map_or(f64::MAX, |b| *b as f64 / h.per);
                (bound, c.load(Ordering::Relaxed))
            })
            .collect();
        // The count as the buckets add up, so that the +Inf bucket and `_count` agree.
        let count = buckets.iter().map(|(_, c)| c).sum();
        encoder.encode_histogram::<NoLabelSet>(
            h.sum.load(Ordering::Relaxed) as f64 / h.per,
            count,
            &buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_atomic_histogram_buckets_and_encodes_like_a_prometheus_histogram() {
        let h = AtomicHistogram::seconds();
        for us in [10u64, 50, 51, 3_000, 100_000_000] {
            h.observe_duration(Duration::from_micros(us));
        }
        let m = Metrics::new();
        m.register("t_seconds", "test", h.clone());
        let text = m.encode();
        // Cumulative counts by upper bound, as a scraper reads them.
        let buckets: Vec<(f64, u64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("plinth_t_seconds_bucket{le=\""))
            .filter_map(|l| {
                let (le, n) = l.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, n.parse().ok()?))
            })
            .collect();
        let at = |le: f64| {
            buckets
                .iter()
                .find(|(b, _)| (b - le).abs() < 1e-12 || (b.is_infinite() && le.is_infinite()))
                .map(|(_, n)| *n)
        };
        assert_eq!(buckets.len(), 20, "{text}");
        assert_eq!(at(0.00005), Some(2), "{text}");
        assert_eq!(at(0.0001), Some(3), "{text}");
        assert_eq!(at(0.0016), Some(3), "{text}");
        assert_eq!(at(0.0032), Some(4), "{text}");
        assert_eq!(at(f64::INFINITY), Some(5), "{text}");
        assert!(text.contains("plinth_t_seconds_count 5"), "{text}");
        assert!(text.contains("plinth_t_seconds_sum 100.003111"), "{text}");
        let sizes = AtomicHistogram::sizes();
        sizes.observe_units(3);
        assert_eq!(sizes.count(), 1);
    }

    #[test]
    fn labels_come_from_a_closed_set() {
        assert_eq!(
            RequestLabels::new("GET", Some("/healthz"), 200).method,
            "GET"
        );
        assert_eq!(RequestLabels::new("PATCH", None, 404).route, OTHER);
        for odd in ["get", "FOO", "X-\u{1}", "", "GETGETGETGETGET"] {
            assert_eq!(RequestLabels::new(odd, None, 405).method, OTHER, "{odd:?}");
        }
    }
}

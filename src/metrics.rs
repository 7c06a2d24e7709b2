//! Prometheus metrics shared by every front door: HTTP request counts and latencies per route and
//! status, and the counters other front doors register (DHCP packets, drops). Exported at `/metrics`
//! by the HTTP front door. Imports no front door.

use std::sync::Mutex;

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

#[cfg(test)]
mod tests {
    use super::*;

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

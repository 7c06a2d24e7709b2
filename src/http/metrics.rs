//! Prometheus metrics: request counts and latencies per route and status, exported at `/metrics`.
//! Front doors other than HTTP register their own counters here through `Metrics::registry`.

use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::AppState;

/// Labels of an HTTP request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Method.
    pub method: String,
    /// Route template (never the raw path: ids would explode cardinality).
    pub route: String,
    /// Status code.
    pub status: u16,
}

/// The registry and the HTTP metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RequestLabels, Histogram>,
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

/// Middleware counting every request.
pub async fn track(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let resp = next.run(req).await;
    let labels = RequestLabels {
        method,
        route,
        status: resp.status().as_u16(),
    };
    s.metrics.requests.get_or_create(&labels).inc();
    s.metrics
        .latency
        .get_or_create(&labels)
        .observe(start.elapsed().as_secs_f64());
    resp
}

/// `GET /metrics`.
pub async fn export(State(s): State<AppState>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

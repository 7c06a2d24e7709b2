//! The HTTP side of metrics: the middleware that counts every request and `GET /metrics`.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::metrics::RequestLabels;

/// Middleware counting every request.
pub async fn track(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    // Labels from a closed set: the method's name only when it is a standard one, the route
    // template only when one matched (never the path a client sent).
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let resp = next.run(req).await;
    observe(
        &s.metrics,
        method.as_str(),
        route.as_deref(),
        resp.status().as_u16(),
        start,
    );
    resp
}

/// Count one answered request and its latency (the hyper routes and the image door alike):
/// `method` as the client sent it, `route` the template that matched (`None`: none did).
pub(crate) fn observe(
    metrics: &crate::metrics::Metrics,
    method: &str,
    route: Option<&str>,
    status: u16,
    start: Instant,
) {
    let labels = RequestLabels::new(method, route, status);
    metrics.requests.get_or_create(&labels).inc();
    metrics
        .latency
        .get_or_create(&labels)
        .observe(start.elapsed().as_secs_f64());
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

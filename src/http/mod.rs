//! The HTTP front door: the `/api/v1` API (machines, tokens, BMCs, configs, workflows, clusters,
//! events), the machines' boot routes (`/boot.ipxe`, `/boot/machine.ipxe`, `/config/`, the iPXE
//! binaries under `/ipxe/`, images under `/images/`), `/healthz`, `/metrics`, the OpenAPI
//! document and the web console (`console`: `/` and `/console/...`); and the image door
//! (`images_listener`), a second listener that serves `/images/` with `sendfile(2)`. Handlers
//! decode the request, call the service (the boot routes ask `ProvisioningService`), and encode
//! the answer; errors become statuses in `error` only. They never touch SQL. Imports `service`,
//! `domain` and `metrics`; never `store`, `bmc` or another front door.

mod bmc;
mod boot;
mod circuits;
mod clusters;
mod configs;
mod console;
pub mod error;
pub mod extract;
mod files;
pub mod images_listener;
mod machines;
pub mod metrics;
mod openapi;
pub mod serve;
mod slots;
mod snapshots;
mod tokens;
mod workflows;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use crate::service::{BmcService, Inventory, Tokens};

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// Inventory use cases.
    pub inventory: Inventory,
    /// Token use cases.
    pub tokens: Tokens,
    /// BMC use cases (power, boot override, virtual media, inspection, capabilities).
    pub bmc: BmcService,
    /// Request metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Body limit in bytes.
    pub max_body_bytes: usize,
    /// The live event feed.
    pub events: crate::service::EventFeed,
    /// The provisioning service: what each booting machine gets.
    pub provisioning: crate::service::provisioning::ProvisioningService,
    /// Machine configs and provisioning windows.
    pub configs: crate::service::ConfigService,
    /// Reinstall workflows.
    pub workflows: crate::service::Workflows,
    /// Rolling Talos upgrades.
    pub upgrades: crate::service::Upgrades,
    /// etcd snapshots and recovery.
    pub snapshots: crate::service::snapshots::Snapshots,
    /// Cancelled when the server shuts down (ends long-lived answers such as event streams).
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Mark the console's session cookie `Secure` (the public URL is https).
    pub secure_cookies: bool,
}

/// The whole HTTP application.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/machines", get(machines::list).post(machines::create))
        .route("/machines/lookup", get(machines::lookup))
        .route("/machines/import", axum::routing::post(machines::import))
        .route(
            "/machines/{id}",
            get(machines::show)
                .patch(machines::update)
                .delete(machines::remove),
        )
        .route(
            "/machines/{id}/state",
            axum::routing::post(machines::set_state),
        )
        .route("/machines/{id}/config", get(configs::status))
        .route(
            "/machines/{id}/config/approve",
            axum::routing::post(configs::approve),
        )
        .route(
            "/machines/{id}/dhcp-circuit",
            get(circuits::show)
                .put(circuits::set)
                .delete(circuits::clear),
        )
        .route("/machines/{id}/status", get(machines::status))
        .route("/machines/{id}/timeline", get(boot::timeline))
        .route(
            "/machines/{id}/provision",
            axum::routing::post(configs::open).delete(configs::close),
        )
        .route(
            "/machines/{id}/reinstall",
            get(workflows::status).post(workflows::start),
        )
        .route(
            "/machines/{id}/reinstall/cancel",
            axum::routing::post(workflows::cancel),
        )
        .route(
            "/clusters/{name}/bootstrap",
            get(clusters::bootstrap_status).post(clusters::bootstrap),
        )
        .route(
            "/clusters/{name}/talosconfig",
            axum::routing::post(clusters::talosconfig),
        )
        .route(
            "/clusters/{name}/kubeconfig",
            axum::routing::post(clusters::kubeconfig),
        )
        .route("/clusters/{name}/health", get(clusters::health))
        .route(
            "/clusters/{name}/upgrade",
            get(clusters::upgrade_status).post(clusters::upgrade),
        )
        .route(
            "/clusters/{name}/upgrade/{action}",
            axum::routing::post(clusters::upgrade_action),
        )
        .route(
            "/clusters/{name}/snapshots",
            get(snapshots::list).post(snapshots::take),
        )
        .route("/clusters/{name}/snapshots/{id}", get(snapshots::show))
        .route(
            "/clusters/{name}/recover",
            axum::routing::post(snapshots::recover),
        )
        .route("/clusters/{name}/recovery", get(snapshots::recovery))
        .route("/events", get(machines::events))
        .route("/events/stream", get(workflows::stream))
        .route("/tokens", get(tokens::list).post(tokens::create))
        .route("/tokens/{id}", axum::routing::delete(tokens::revoke))
        .route("/openapi.json", get(openapi::document))
        .merge(bmc::routes());
    Router::new()
        .nest("/api/v1", api)
        .route("/healthz", get(healthz))
        .route("/boot.ipxe", get(boot::generic))
        .route("/boot/machine.ipxe", get(boot::machine))
        .route("/config/{id}", get(configs::fetch))
        .route("/ipxe/{file}", get(boot::ipxe_binary))
        .route("/images/{schematic}/{version}/{file}", get(boot::image))
        .route("/metrics", get(metrics::export))
        .merge(console::routes())
        .fallback(|| async {
            error::ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
        })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state)
}

/// How long each of `/healthz`'s database probes (a read, a heartbeat write) may take.
const HEALTH_PROBE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Liveness, and a database that answers reads and takes writes.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "serving"), (status = 503, description = "database unreachable, or it cannot write")))]
async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    use crate::service::inventory::DatabaseHealth;
    let instance = heartbeat_instance();
    match s.inventory.health(instance, HEALTH_PROBE_LIMIT).await {
        DatabaseHealth::Ok => (StatusCode::OK, Json(serde_json::json!({"status": "ok"}))),
        DatabaseHealth::Unreachable(e) => {
            tracing::warn!(error = %e, "health check: database unreachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"status": "database unreachable"})),
            )
        }
        DatabaseHealth::ReadOnly(e) => {
            tracing::warn!(error = %e, "health check: database cannot write");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"status": "database cannot write"})),
            )
        }
    }
}

/// The heartbeat row of this host (instances on one host share it; restarts reuse it).
fn heartbeat_instance() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "plinth".into())
    })
}

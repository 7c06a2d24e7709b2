//! Clusters over HTTP: bootstrap (`POST /api/v1/clusters/{name}/bootstrap`, admins), the
//! credentials for humans (`POST .../talosconfig`, `POST .../kubeconfig`, admins; each an event
//! naming who asked) and health (`GET .../health`, measured now and stored, or the last stored
//! with `?cached=true`). Decodes, calls `service::clusters`, encodes; a refusal of the Talos API is
//! a 502 naming node, call and cause.

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::error::{ApiError, ErrorEnvelope};
use super::extract::{Caller, JsonBody, QueryParams};
use super::AppState;
use crate::service::clusters::{BootstrapError, ClusterHealth};
use crate::service::ports::talos_state::BootstrapRecord;
use crate::service::ApiRole;

/// Longest lifetime of a talosconfig or kubeconfig Plinth signs: 30 days.
pub const MAX_CREDENTIAL_TTL_SECONDS: u64 = 30 * 24 * 3600;
const DEFAULT_TTL_SECONDS: u64 = 8 * 3600;

/// A bootstrap request.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BootstrapRequest {
    /// The node (host name, id or address); default: the first verified control plane.
    #[serde(default)]
    pub node: Option<String>,
}

/// A credentials request.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialRequest {
    /// Talos role (talosconfig only): `os:admin` (default), `os:operator`, `os:reader`,
    /// `os:etcd:backup`.
    #[serde(default)]
    pub role: Option<String>,
    /// Lifetime in seconds (default 8 h, at most 30 days).
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

/// Health query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct HealthParams {
    /// Answer the last stored measurement instead of measuring now.
    #[serde(default)]
    pub cached: bool,
}

fn bootstrap_error(e: BootstrapError) -> ApiError {
    match e {
        BootstrapError::Already(r) => ApiError::new(
            StatusCode::CONFLICT,
            "already_bootstrapped",
            BootstrapError::Already(r).to_string(),
        ),
        e @ BootstrapError::NotPossible(_) => ApiError::new(
            StatusCode::CONFLICT,
            "bootstrap_not_possible",
            e.to_string(),
        ),
        e @ BootstrapError::Refused(_) => {
            ApiError::new(StatusCode::BAD_GATEWAY, "talos_refused", e.to_string())
        }
        e @ BootstrapError::Unknown(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "bootstrap_outcome_unknown",
            e.to_string(),
        ),
        BootstrapError::Service(s) => s.into(),
    }
}

fn ttl(req: &CredentialRequest) -> Result<chrono::Duration, ApiError> {
    let secs = req.ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS);
    if !(60..=MAX_CREDENTIAL_TTL_SECONDS).contains(&secs) {
        return Err(ApiError::bad_field(
            "ttl_seconds",
            format!("must be between 60 and {MAX_CREDENTIAL_TTL_SECONDS} (30 days)"),
        ));
    }
    Ok(chrono::Duration::seconds(secs as i64))
}

fn yaml(text: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/yaml"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

/// Bootstrap the cluster's etcd, exactly once: on `node` or the first verified control plane.
/// 409 once the cluster was bootstrapped (naming when, where and by which instance), 502 when the
/// node refused, 504 when the outcome is unknown (never retried).
#[utoipa::path(post, path = "/api/v1/clusters/{name}/bootstrap", tag = "clusters", request_body = BootstrapRequest,
    params(("name" = String, Path, description = "cluster name")),
    responses((status = 200, body = Object), (status = 409, body = ErrorEnvelope), (status = 502, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn bootstrap(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<BootstrapRequest>,
) -> Result<Json<BootstrapRecord>, ApiError> {
    caller.require(ApiRole::Admin)?;
    let r = s
        .workflows
        .clusters()
        .bootstrap(&name, req.node.as_deref(), &caller.actor())
        .await
        .map_err(bootstrap_error)?;
    Ok(Json(r))
}

/// The cluster's bootstrap record (404 while never claimed).
#[utoipa::path(get, path = "/api/v1/clusters/{name}/bootstrap", tag = "clusters",
    params(("name" = String, Path, description = "cluster name")),
    responses((status = 200, body = Object), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn bootstrap_status(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<BootstrapRecord>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    match s.workflows.clusters().bootstrap_record(&name).await? {
        Some(r) => Ok(Json(r)),
        None => Err(
            crate::service::ServiceError::NotFound(format!("bootstrap of cluster {name}")).into(),
        ),
    }
}

/// A talosconfig signed now from the cluster's OS CA (YAML). Admins only; an event names who.
#[utoipa::path(post, path = "/api/v1/clusters/{name}/talosconfig", tag = "clusters", request_body = CredentialRequest,
    params(("name" = String, Path, description = "cluster name")),
    responses((status = 200, content_type = "application/yaml", body = String), (status = 403, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn talosconfig(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<CredentialRequest>,
) -> Result<Response, ApiError> {
    caller.require(ApiRole::Admin)?;
    let ttl = ttl(&req)?;
    let role = req.role.as_deref().unwrap_or("os:admin");
    let text = s
        .workflows
        .clusters()
        .talosconfig(&name, role, ttl, &caller.actor())
        .await?;
    Ok(yaml(text))
}

/// An admin kubeconfig signed now from the cluster's Kubernetes CA (YAML). Admins only; an event
/// names who.
#[utoipa::path(post, path = "/api/v1/clusters/{name}/kubeconfig", tag = "clusters", request_body = CredentialRequest,
    params(("name" = String, Path, description = "cluster name")),
    responses((status = 200, content_type = "application/yaml", body = String), (status = 403, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn kubeconfig(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<CredentialRequest>,
) -> Result<Response, ApiError> {
    caller.require(ApiRole::Admin)?;
    if req.role.is_some() {
        return Err(ApiError::bad_field(
            "role",
            "a kubeconfig is always cluster-admin (system:masters); roles apply to talosconfigs",
        ));
    }
    let ttl = ttl(&req)?;
    let text = s
        .workflows
        .clusters()
        .kubeconfig(&name, ttl, &caller.actor())
        .await?;
    Ok(yaml(text))
}

/// The cluster's health, measured now through the Talos API (and stored), or the last stored.
#[utoipa::path(get, path = "/api/v1/clusters/{name}/health", tag = "clusters", params(HealthParams,
    ("name" = String, Path, description = "cluster name")),
    responses((status = 200, body = ClusterHealth), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn health(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    QueryParams(q): QueryParams<HealthParams>,
) -> Result<Json<ClusterHealth>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let clusters = s.workflows.clusters();
    if q.cached {
        return match clusters.last_health(&name).await? {
            Some(h) => Ok(Json(h)),
            None => Err(crate::service::ServiceError::NotFound(format!(
                "health of cluster {name}"
            ))
            .into()),
        };
    }
    Ok(Json(clusters.measure(&name).await?))
}

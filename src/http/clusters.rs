//! Clusters over HTTP: bootstrap (`POST /api/v1/clusters/{name}/bootstrap`, admins), the
//! credentials for humans (`POST .../talosconfig`, `POST .../kubeconfig`, admins; each an event
//! naming who asked) and health (`GET .../health`, measured now and stored, or the last stored
//! with `?cached=true`); rolling upgrades (`POST .../upgrade` plans with `dry_run`, else starts
//! one, 409 naming the failed pre-checks; `GET .../upgrade` the newest rollout and its nodes;
//! `POST .../upgrade/{pause,resume,abort}`). Decodes, calls `service::clusters` and
//! `service::upgrade`, encodes; a refusal of the Talos API is a 502 naming node, call and cause.

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
use crate::service::upgrade::{RolloutStatus, UpgradeError, UpgradePlan};
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

/// An upgrade request.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpgradeRequest {
    /// The target Talos version, `v1.13.9`.
    pub to: String,
    /// Image Factory schematic id of the target's installer (default: the cluster's).
    #[serde(default)]
    pub schematic: Option<String>,
    /// Only plan: the pre-checks, the order and each node's installer; nothing is started.
    #[serde(default)]
    pub dry_run: bool,
}

fn upgrade_error(e: UpgradeError) -> ApiError {
    match e {
        UpgradeError::Refused(plan) => {
            let checks = serde_json::to_value(&plan.checks).unwrap_or_default();
            ApiError::new(
                StatusCode::CONFLICT,
                "upgrade_refused",
                UpgradeError::Refused(plan).to_string(),
            )
            .with_checks(checks)
        }
        e @ UpgradeError::Already(_) => {
            ApiError::new(StatusCode::CONFLICT, "upgrade_running", e.to_string())
        }
        e @ UpgradeError::NotPossible(_) => {
            ApiError::new(StatusCode::CONFLICT, "upgrade_not_possible", e.to_string())
        }
        UpgradeError::Service(s) => s.into(),
    }
}

/// Plan (`dry_run`: operators) or start (admins) a rolling Talos upgrade of the cluster. 200 with
/// the plan; 202 with the started rollout; 409 `upgrade_refused` naming each failed pre-check
/// (every node healthy, etcd at full quorum, a fresh verified etcd snapshot, the upgrade path,
/// no other rollout), or `upgrade_running`.
#[utoipa::path(post, path = "/api/v1/clusters/{name}/upgrade", tag = "clusters", request_body = UpgradeRequest,
    params(("name" = String, Path, description = "cluster name")),
    responses((status = 200, body = UpgradePlan), (status = 202, body = RolloutStatus),
        (status = 409, body = ErrorEnvelope), (status = 403, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn upgrade(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<UpgradeRequest>,
) -> Result<Response, ApiError> {
    if req.dry_run {
        caller.require(ApiRole::Operator)?;
        let plan = s
            .upgrades
            .plan(&name, &req.to, req.schematic.as_deref())
            .await
            .map_err(upgrade_error)?;
        return Ok(Json(plan).into_response());
    }
    caller.require(ApiRole::Admin)?;
    let started = s
        .upgrades
        .start(&name, &req.to, req.schematic.as_deref(), &caller.actor())
        .await
        .map_err(upgrade_error)?;
    Ok((StatusCode::ACCEPTED, Json(started)).into_response())
}

/// The cluster's newest upgrade rollout and each node's step (404 when there never was one).
#[utoipa::path(get, path = "/api/v1/clusters/{name}/upgrade", tag = "clusters",
    params(("name" = String, Path, description = "cluster name")),
    responses((status = 200, body = RolloutStatus), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn upgrade_status(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<RolloutStatus>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    Ok(Json(s.upgrades.status(&name).await.map_err(upgrade_error)?))
}

/// `pause` (operators: the node in flight finishes, no further node starts), `resume` or `abort`
/// (admins) the cluster's active rollout. 409 when it is not in a state that allows it.
#[utoipa::path(post, path = "/api/v1/clusters/{name}/upgrade/{action}", tag = "clusters",
    params(("name" = String, Path, description = "cluster name"),
        ("action" = String, Path, description = "pause, resume or abort")),
    responses((status = 200, body = RolloutStatus), (status = 409, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn upgrade_action(
    State(s): State<AppState>,
    caller: Caller,
    Path((name, action)): Path<(String, String)>,
) -> Result<Json<RolloutStatus>, ApiError> {
    let actor = caller.actor();
    let r = match action.as_str() {
        "pause" => {
            caller.require(ApiRole::Operator)?;
            s.upgrades.pause(&name, &actor).await
        }
        "resume" => {
            caller.require(ApiRole::Admin)?;
            s.upgrades.resume(&name, &actor).await
        }
        "abort" => {
            caller.require(ApiRole::Admin)?;
            s.upgrades.abort(&name, &actor).await
        }
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("`{other}` is not an upgrade action: pause, resume or abort"),
            ))
        }
    };
    Ok(Json(r.map_err(upgrade_error)?))
}

//! Machine configs over HTTP: `GET /config/{id}` (what Talos fetches through `talos.config=`,
//! authenticated by the boot's token, the SMBIOS UUID and the source address, never by an API
//! token), and the operator's view: `GET /api/v1/machines/{id}/config` (does it render, its digest,
//! warnings, the window; never the config itself) and `POST|DELETE
//! /api/v1/machines/{id}/provision` (open or close the provisioning window).
//!
//! Talos treats only 200 as success and retries anything else with back-off for hours, so the
//! answers are deliberate and carry no detail: 200 with the config, and one answer for every
//! refusal (404 with an empty body after the same minimum time, whether the id exists, a window is
//! open, or the token, UUID or address is wrong), so a refusal tells which ids exist and which
//! windows are open neither by its status nor by its timing; 503 only when the store cannot be
//! read. The reason is in the machine's events, never in the answer or the log line's URL.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ErrorEnvelope};
use super::extract::{Caller, JsonBody};
use super::AppState;
use crate::domain::MachineId;
use crate::service::machine_config::ConfigStatus;
use crate::service::{ApiRole, ProvisionWindow, Refusal};

/// What Talos sends.
#[derive(Deserialize)]
pub struct FetchParams {
    /// The boot's token.
    token: Option<String>,
    /// SMBIOS UUID, substituted by Talos from `${uuid}`.
    uuid: Option<String>,
}

/// `GET /config/{id}?token=..&uuid=${uuid}`.
pub async fn fetch(
    State(s): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
    Query(q): Query<FetchParams>,
) -> Response {
    let Ok(id) = id.parse::<MachineId>() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match s
        .configs
        .fetch(
            &s.inventory,
            id,
            q.token.as_deref(),
            q.uuid.as_deref(),
            peer.ip(),
        )
        .await
    {
        Ok(yaml) => (
            [
                (header::CONTENT_TYPE, "application/yaml"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            yaml,
        )
            .into_response(),
        Err(Refusal::Denied) => StatusCode::NOT_FOUND.into_response(),
        Err(Refusal::Unavailable) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// Whether a machine's config renders and validates, and its provisioning window. Never the
/// config itself (it carries cluster secrets): `plinth config render` shows it to an operator
/// with database access.
#[utoipa::path(get, path = "/api/v1/machines/{id}/config", tag = "configs",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = ConfigStatus), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn status(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ConfigStatus>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let m = s.inventory.resolve(&id).await?;
    Ok(Json(s.configs.status(&m).await?))
}

/// Opening a provisioning window.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenWindow {
    /// How long the window stays open, seconds (60-86400, default 3600).
    #[serde(default)]
    pub ttl_seconds: Option<u32>,
    /// Wipe the system disk on the install boot (`talos.experimental.wipe=system`).
    #[serde(default)]
    pub wipe: bool,
}

/// An opened window.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WindowOpened {
    /// The window.
    pub window: ProvisionWindow,
    /// SHA-256 of the config it will serve.
    pub sha256: String,
    /// Warnings of the render.
    pub warnings: Vec<String>,
}

/// Open the machine's provisioning window: its config must render and validate (422 naming why
/// not); its cluster's Talos image is checked (a warning when it is not cached; the pull starts
/// when a factory is configured); the machine becomes `provisioning`, and its next network boot installs Talos with a
/// token minted for that boot.
#[utoipa::path(post, path = "/api/v1/machines/{id}/provision", tag = "configs", request_body = OpenWindow,
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = WindowOpened), (status = 409, body = ErrorEnvelope, description = "the lifecycle does not allow provisioning now"),
              (status = 422, body = ErrorEnvelope, description = "the config does not render or validate")),
    security(("bearer" = [])))]
pub async fn open(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<OpenWindow>,
) -> Result<Json<WindowOpened>, ApiError> {
    caller.require(ApiRole::Operator)?;
    let ttl = req.ttl_seconds.unwrap_or(3600);
    if !(60..=86_400).contains(&ttl) {
        let mut e = crate::domain::ValidationErrors::default();
        e.push("ttl_seconds", "must be between 60 and 86400");
        return Err(crate::service::ServiceError::Invalid(e).into());
    }
    let m = s.inventory.resolve(&id).await?;
    // The image first: a pull it needs starts now rather than at the machine's first boot.
    let image = s.provisioning.prepare_image(&m).await?;
    let (window, rendered) = s
        .configs
        .open_window(
            &s.inventory,
            m.id,
            chrono::Duration::seconds(i64::from(ttl)),
            req.wipe,
            &caller.actor(),
        )
        .await
        .map_err(|e| match e {
            crate::service::machine_config::OpenError::Service(e) => ApiError::from(e),
            crate::service::machine_config::OpenError::Config(c) => {
                ApiError::from(crate::service::ServiceError::from(c))
            }
        })?;
    tracing::info!(machine = %m.id, name = %m.display_name(), actor = %caller.actor(), expires_at = %window.expires_at, "provisioning window opened");
    let mut warnings = rendered.warnings;
    warnings.extend(image);
    Ok(Json(WindowOpened {
        window,
        sha256: rendered.sha256,
        warnings,
    }))
}

/// Approving a config release.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveRelease {
    /// The code the machine's console shows (`XXXX-XXXX`; case and separators do not matter).
    pub code: String,
}

/// Approve the release of the machine's config for its current install boot (clusters with
/// `delivery: approve`), matching the code its console shows; the config is served at its next
/// fetch.
#[utoipa::path(post, path = "/api/v1/machines/{id}/config/approve", tag = "configs", request_body = ApproveRelease,
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 204, description = "approved"), (status = 400, body = ErrorEnvelope, description = "no boot awaits approval, or the code is not its code"),
              (status = 404, body = ErrorEnvelope, description = "no open window")),
    security(("bearer" = [])))]
pub async fn approve(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ApproveRelease>,
) -> Result<StatusCode, ApiError> {
    caller.require(ApiRole::Operator)?;
    let m = s.inventory.resolve(&id).await?;
    s.configs.approve(m.id, &req.code, &caller.actor()).await?;
    tracing::info!(machine = %m.id, name = %m.display_name(), actor = %caller.actor(), "config release approved");
    Ok(StatusCode::NO_CONTENT)
}

/// Close the machine's provisioning window: its config is no longer served. A machine still
/// `provisioning` is stopped as a cancel does (it goes to `maintenance`, freeing its control-plane
/// and rack slots, and a running reinstall ends as `cancelled`), so it never stays provisioning
/// with nothing to install it.
#[utoipa::path(delete, path = "/api/v1/machines/{id}/provision", tag = "configs",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 204, description = "closed"), (status = 404, body = ErrorEnvelope, description = "no open window")),
    security(("bearer" = [])))]
pub async fn close(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require(ApiRole::Operator)?;
    let m = s.inventory.resolve(&id).await?;
    if m.state == crate::domain::LifecycleState::Provisioning {
        s.workflows.cancel(m.id, &caller.actor()).await?;
        return Ok(StatusCode::NO_CONTENT);
    }
    if s.configs
        .close_window(m.id, "closed by an operator", &caller.actor())
        .await
        .map_err(crate::service::ServiceError::from)?
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(crate::service::ServiceError::NotFound("open provisioning window".into()).into())
    }
}

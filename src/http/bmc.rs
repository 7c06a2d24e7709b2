//! `/api/v1/machines/{id}/...` for a machine's BMC: `power`, `boot-once`, `media`, `inspect` and
//! `bmc/capabilities` (`bmc/probe`). Reads need the viewer role, actions the operator role. The
//! handlers decode, call `BmcService`, and encode; BMC failures become answers in `error.rs`.
//! Must not import `bmc` (the Redfish client), `store` or another front door.

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::error::{ApiError, ErrorEnvelope};
use super::extract::{Caller, JsonBody};
use super::AppState;
use crate::service::bmc::{
    BootMode, BootOnceReport, BootTarget, InspectionReport, MediaReport, PowerAction, PowerReport,
};
use crate::service::{ApiRole, CapabilityRecord};

/// The BMC routes, to be merged into the `/api/v1` router.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/machines/{id}/power", get(power_status).post(power))
        .route("/machines/{id}/boot-once", post(boot_once))
        .route(
            "/machines/{id}/media",
            get(media_status).post(media_insert).delete(media_eject),
        )
        .route("/machines/{id}/inspect", post(inspect))
        .route(
            "/machines/{id}/bmc/capabilities",
            get(capabilities).post(refresh_capabilities),
        )
        .route("/machines/{id}/bmc/probe", post(probe))
}

/// A power operation.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PowerRequest {
    /// `on`, `off`, `cycle` or `graceful-restart`.
    pub action: PowerAction,
}

/// A one-time boot override.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BootOnceRequest {
    /// `pxe`, `http` or `cd`.
    pub target: BootTarget,
    /// `uefi` or `legacy`; absent: leave the mode as the BMC has it.
    #[serde(default)]
    pub mode: Option<BootMode>,
}

/// An image for the virtual CD/DVD slot.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MediaInsertRequest {
    /// http(s) URL of the ISO, reachable from the BMC.
    pub image: String,
}

/// The power state of a machine, as its BMC reports it.
#[utoipa::path(get, path = "/api/v1/machines/{id}/power", tag = "bmc",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = PowerReport), (status = 404, body = ErrorEnvelope),
              (status = 409, body = ErrorEnvelope, description = "the machine has no BMC"),
              (status = 502, body = ErrorEnvelope, description = "the BMC is unreachable, refused the credentials or failed")),
    security(("bearer" = [])))]
pub async fn power_status(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<PowerReport>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    Ok(Json(s.bmc.power_state(&id).await?))
}

/// Power a machine on, off, cycle it or restart it gracefully; answers once the BMC reports the
/// state the operation implies.
#[utoipa::path(post, path = "/api/v1/machines/{id}/power", tag = "bmc", request_body = PowerRequest,
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = PowerReport), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope),
              (status = 409, body = ErrorEnvelope, description = "the machine has no BMC"),
              (status = 422, body = ErrorEnvelope, description = "the BMC does not offer this operation"),
              (status = 502, body = ErrorEnvelope), (status = 504, body = ErrorEnvelope, description = "the state was not reached in time")),
    security(("bearer" = [])))]
pub async fn power(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<PowerRequest>,
) -> Result<Json<PowerReport>, ApiError> {
    caller.require(ApiRole::Operator)?;
    Ok(Json(s.bmc.power(&id, req.action, &caller.actor()).await?))
}

/// Boot once from PXE, UEFI HTTP or the (virtual) CD; the override is read back from the BMC.
#[utoipa::path(post, path = "/api/v1/machines/{id}/boot-once", tag = "bmc", request_body = BootOnceRequest,
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = BootOnceReport), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope),
              (status = 409, body = ErrorEnvelope, description = "no BMC, or the BMC did not keep the override (`bmc.wanted`, `bmc.actual`)"),
              (status = 422, body = ErrorEnvelope), (status = 502, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn boot_once(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<BootOnceRequest>,
) -> Result<Json<BootOnceReport>, ApiError> {
    caller.require(ApiRole::Operator)?;
    Ok(Json(
        s.bmc
            .boot_once(&id, req.target, req.mode, &caller.actor())
            .await?,
    ))
}

/// The virtual CD/DVD slot.
#[utoipa::path(get, path = "/api/v1/machines/{id}/media", tag = "bmc",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = MediaReport), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope),
              (status = 422, body = ErrorEnvelope, description = "the BMC has no virtual media"), (status = 502, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn media_status(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<MediaReport>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    Ok(Json(s.bmc.media_status(&id).await?))
}

/// Insert an image into the virtual CD/DVD slot (what is there is ejected first).
#[utoipa::path(post, path = "/api/v1/machines/{id}/media", tag = "bmc", request_body = MediaInsertRequest,
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = MediaReport), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope),
              (status = 409, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope), (status = 502, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn media_insert(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<MediaInsertRequest>,
) -> Result<Json<MediaReport>, ApiError> {
    caller.require(ApiRole::Operator)?;
    Ok(Json(
        s.bmc.media_insert(&id, &req.image, &caller.actor()).await?,
    ))
}

/// Eject the virtual CD/DVD slot.
#[utoipa::path(delete, path = "/api/v1/machines/{id}/media", tag = "bmc",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = MediaReport), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope),
              (status = 422, body = ErrorEnvelope), (status = 502, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn media_eject(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<MediaReport>, ApiError> {
    caller.require(ApiRole::Operator)?;
    Ok(Json(s.bmc.media_eject(&id, &caller.actor()).await?))
}

/// Inspect the machine through its BMC without booting it, and update the inventory: empty fields
/// are filled, unknown NICs and disks added; values that contradict the inventory are listed in
/// `conflicts` and not written.
#[utoipa::path(post, path = "/api/v1/machines/{id}/inspect", tag = "bmc",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = InspectionReport), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope),
              (status = 502, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn inspect(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<InspectionReport>, ApiError> {
    caller.require(ApiRole::Operator)?;
    Ok(Json(s.bmc.inspect(&id, &caller.actor()).await?))
}

/// The capability record of the machine's BMC (probed at registration and on demand).
#[utoipa::path(get, path = "/api/v1/machines/{id}/bmc/capabilities", tag = "bmc",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = CapabilityRecord), (status = 404, body = ErrorEnvelope, description = "no such machine, or never probed"),
              (status = 409, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn capabilities(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<CapabilityRecord>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    Ok(Json(s.bmc.capabilities(&id).await?))
}

/// Probe the BMC again and store its capability record; a failed probe is stored (with the
/// capabilities of the last good one) and answered as the BMC error.
#[utoipa::path(post, path = "/api/v1/machines/{id}/bmc/capabilities", tag = "bmc",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = CapabilityRecord), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope),
              (status = 502, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn refresh_capabilities(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<CapabilityRecord>, ApiError> {
    caller.require(ApiRole::Operator)?;
    Ok(Json(s.bmc.probe(&id, &caller.actor()).await?))
}

/// Same as `POST .../bmc/capabilities`.
#[utoipa::path(post, path = "/api/v1/machines/{id}/bmc/probe", tag = "bmc",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = CapabilityRecord), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope),
              (status = 502, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn probe(
    state: State<AppState>,
    caller: Caller,
    id: Path<String>,
) -> Result<Json<CapabilityRecord>, ApiError> {
    refresh_capabilities(state, caller, id).await
}

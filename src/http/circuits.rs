//! The relay circuit a machine's DHCP is pinned to, over HTTP: `GET|PUT|DELETE
//! /api/v1/machines/{id}/dhcp-circuit`. Viewers see it; operators set or clear it (a cleared
//! pin is set again by the machine's next relayed REQUEST).

use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ErrorEnvelope};
use super::extract::{Caller, JsonBody};
use super::AppState;
use crate::service::ports::CircuitPin;
use crate::service::ApiRole;

/// A machine's pin (`null` when it has none).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CircuitAnswer {
    /// The pin.
    pub dhcp_circuit: Option<CircuitPin>,
}

/// Setting a machine's pin.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetCircuit {
    /// The relay agent's IPv4 address (`giaddr`).
    pub relay: String,
    /// Option 82 circuit id as hex (absent: the relay sends none).
    #[serde(default)]
    pub circuit_id: Option<String>,
    /// Option 82 remote id as hex (recorded, not compared).
    #[serde(default)]
    pub remote_id: Option<String>,
}

/// A machine's relay circuit pin.
#[utoipa::path(get, path = "/api/v1/machines/{id}/dhcp-circuit", tag = "machines",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = CircuitAnswer), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn show(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<CircuitAnswer>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let m = s.inventory.resolve(&id).await?;
    Ok(Json(CircuitAnswer {
        dhcp_circuit: s.configs.circuit_pin(m.id).await?,
    }))
}

/// Pin a machine's DHCP to a relay circuit (say, after moving it to another switch port).
#[utoipa::path(put, path = "/api/v1/machines/{id}/dhcp-circuit", tag = "machines", request_body = SetCircuit,
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = CircuitAnswer), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn set(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SetCircuit>,
) -> Result<Json<CircuitAnswer>, ApiError> {
    caller.require(ApiRole::Operator)?;
    let m = s.inventory.resolve(&id).await?;
    let pin = s
        .configs
        .set_circuit_pin(
            m.id,
            Some(&req.relay),
            req.circuit_id.as_deref(),
            req.remote_id.as_deref(),
            &caller.actor(),
        )
        .await?;
    tracing::info!(machine = %m.id, name = %m.display_name(), actor = %caller.actor(), relay = %req.relay, "dhcp circuit pin set");
    Ok(Json(CircuitAnswer { dhcp_circuit: pin }))
}

/// Clear a machine's pin: its next relayed REQUEST pins the circuit it comes through.
#[utoipa::path(delete, path = "/api/v1/machines/{id}/dhcp-circuit", tag = "machines",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = CircuitAnswer), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn clear(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<CircuitAnswer>, ApiError> {
    caller.require(ApiRole::Operator)?;
    let m = s.inventory.resolve(&id).await?;
    s.configs
        .set_circuit_pin(m.id, None, None, None, &caller.actor())
        .await?;
    tracing::info!(machine = %m.id, name = %m.display_name(), actor = %caller.actor(), "dhcp circuit pin cleared");
    Ok(Json(CircuitAnswer { dhcp_circuit: None }))
}

//! `/api/v1/tokens`: admins mint, list and revoke API tokens. A new token's secret is in the
//! creation answer once; only its hash is stored.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::{ApiError, ErrorEnvelope};
use super::extract::{Caller, JsonBody};
use super::AppState;
use crate::service::{ApiRole, TokenInfo};

/// A token to mint.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTokenRequest {
    /// Name, shown as the actor of events.
    pub name: String,
    /// Role.
    pub role: ApiRole,
    /// Optional expiry.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
}

/// A minted token: the secret appears here once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MintedToken {
    /// The secret, for `Authorization: Bearer`.
    pub token: String,
    /// Its metadata.
    pub info: TokenInfo,
}

/// Mint a token (admin).
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens", request_body = NewTokenRequest,
    responses((status = 201, body = MintedToken), (status = 403, body = ErrorEnvelope)), security(("bearer" = [])))]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<NewTokenRequest>,
) -> Result<(StatusCode, Json<MintedToken>), ApiError> {
    caller.require(ApiRole::Admin)?;
    let name = req.name.trim();
    if name.is_empty() || name.len() > 100 || name.chars().any(char::is_control) {
        return Err(ApiError::bad_field("name", "1-100 printable characters"));
    }
    if req.expires_at.is_some_and(|e| e <= Utc::now()) {
        return Err(ApiError::bad_field("expires_at", "must be in the future"));
    }
    let (token, info) = s
        .tokens
        .create(name, req.role, req.expires_at, &caller.actor())
        .await?;
    tracing::info!(token_id = %info.id, role = %info.role, actor = %caller.actor(), "token minted");
    Ok((StatusCode::CREATED, Json(MintedToken { token, info })))
}

/// List tokens (admin); never their secrets.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens",
    responses((status = 200, body = Vec<TokenInfo>), (status = 403, body = ErrorEnvelope)), security(("bearer" = [])))]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<TokenInfo>>, ApiError> {
    caller.require(ApiRole::Admin)?;
    Ok(Json(s.tokens.list().await?))
}

/// Revoke a token (admin).
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "tokens", params(("id" = Uuid, Path, description = "token id")),
    responses((status = 204, description = "revoked"), (status = 404, body = ErrorEnvelope)), security(("bearer" = [])))]
pub async fn revoke(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require(ApiRole::Admin)?;
    let id: Uuid = id
        .parse()
        .map_err(|_| ApiError::bad_field("id", "not a token id (UUID)"))?;
    if s.tokens.revoke(id, &caller.actor()).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no live token with that id",
        ))
    }
}

//! Reinstall over HTTP (`POST|GET /api/v1/machines/{id}/reinstall`, `POST
//! /api/v1/machines/{id}/reinstall/cancel`) and the live event stream
//! (`GET /api/v1/events/stream`, server-sent events) that a dashboard or a chat hook follows a
//! rollout with: the live event feed (`service::events`) as SSE. It shows what every instance
//! sharing the database did, resumes from `Last-Event-ID`, and ends when the server shuts down or
//! the caller's token is revoked or expires.

use std::convert::Infallible;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::Json;
use futures::{Stream, StreamExt};
use serde::Deserialize;

use super::error::{ApiError, ErrorEnvelope};
use super::extract::{Caller, JsonBody, QueryParams};
use super::AppState;
use crate::service::workflow::{Cancelled, Started};
use crate::service::Reinstall;
use crate::service::{ApiRole, Follow};

/// A reinstall request.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReinstallRequest {
    /// Wipe the system disk on the install boot (`talos.experimental.wipe=system`).
    #[serde(default)]
    pub wipe: bool,
}

/// Reinstall a machine: check its cluster's Talos image (a warning in `warnings` when it is not
/// cached; the pull starts when a factory is configured), open its provisioning window, set a
/// one-time network boot and power-cycle it through its BMC (or tell the tech to), then follow
/// the boot to `installed`,
/// each stage with a deadline. Refused with 409 when a reinstall is already running or the safety
/// rules say no (one control plane of a cluster at a time, workers per rack), 422 when its config
/// does not render or validate.
#[utoipa::path(post, path = "/api/v1/machines/{id}/reinstall", tag = "workflows", request_body = ReinstallRequest,
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 202, body = Started), (status = 409, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn start(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ReinstallRequest>,
) -> Result<(axum::http::StatusCode, Json<Started>), ApiError> {
    caller.require(ApiRole::Operator)?;
    let m = s.inventory.resolve(&id).await?;
    // The image first: a pull it needs starts now rather than at the machine's first boot.
    let image = s.provisioning.prepare_image(&m).await?;
    let mut started = s.workflows.start(m.id, req.wipe, &caller.actor()).await?;
    started.warnings.extend(image);
    Ok((axum::http::StatusCode::ACCEPTED, Json(started)))
}

/// Cancel the machine's reinstall at whatever stage it is: the machine goes to `maintenance`
/// (its provisioning window closes, its control-plane and rack slots are freed, and the cluster's
/// automatic reinstall leaves it alone), the workflow ends as `cancelled` and the
/// `reinstall.cancelled` event names the caller's token. Also stops a provisioning machine whose
/// window was opened without a workflow. 409 when there is nothing to cancel.
#[utoipa::path(post, path = "/api/v1/machines/{id}/reinstall/cancel", tag = "workflows",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = Cancelled), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Cancelled>, ApiError> {
    caller.require(ApiRole::Operator)?;
    let m = s.inventory.resolve(&id).await?;
    Ok(Json(s.workflows.cancel(m.id, &caller.actor()).await?))
}

/// The machine's current or last reinstall.
#[utoipa::path(get, path = "/api/v1/machines/{id}/reinstall", tag = "workflows",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = Reinstall), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn status(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Reinstall>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let m = s.inventory.resolve(&id).await?;
    match s.workflows.status(m.id).await? {
        Some(r) => Ok(Json(r)),
        None => Err(crate::service::ServiceError::NotFound("reinstall".into()).into()),
    }
}

/// Filters of the stream.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct StreamParams {
    /// Machine id or host name.
    pub machine: Option<String>,
    /// Kind prefix, e.g. `reinstall.`.
    pub kind: Option<String>,
    /// Start after this event id (default: `Last-Event-ID`, else only new events).
    pub after: Option<i64>,
}

/// Follow the event log live (server-sent events: `id` is the event id, `event` its kind, `data`
/// the event as JSON).
#[utoipa::path(get, path = "/api/v1/events/stream", tag = "events", params(StreamParams),
    responses((status = 200, description = "text/event-stream of events")),
    security(("bearer" = [])))]
pub async fn stream(
    State(s): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    QueryParams(p): QueryParams<StreamParams>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let machine_id = match p.machine.as_deref() {
        Some(m) => Some(s.inventory.resolve(m).await?.id),
        None => None,
    };
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    let follow = Follow {
        machine: machine_id,
        kind_prefix: p.kind,
        after: p.after.or(resume),
        token: Some(caller.0.id),
        session: None,
    };
    let feed = s
        .events
        .follow(follow, s.shutdown.clone())
        .await
        .map_err(crate::service::ServiceError::from)?;
    let events = feed.map(|e| {
        let data = serde_json::to_string(&e).unwrap_or_default();
        Ok(SseEvent::default()
            .id(e.id.to_string())
            .event(e.kind.clone())
            .data(data))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

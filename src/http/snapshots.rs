//! etcd snapshots and recovery over HTTP: take one now (`POST /api/v1/clusters/{name}/snapshots`,
//! operators), list them (`GET .../snapshots`, `GET .../snapshots/{id}`, viewers), recover from
//! one (`POST .../recover`, admins; refused with 409 while etcd has quorum unless forced with the
//! cluster's name typed in `confirm`) and the cluster's recovery record (`GET .../recovery`).
//! Taking and recovering run in tasks of their own; their requests wait at most `wait_seconds`
//! (240, under the 300 s request timeout), then answer 202 with the record so far.
//! Decodes, calls `service::snapshots`, encodes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use uuid::Uuid;

use super::error::{ApiError, ErrorEnvelope};
use super::extract::{Caller, JsonBody, QueryParams};
use super::AppState;
use crate::service::ports::snapshots::{RecoveryRecord, SnapshotRecord};
use crate::service::snapshots::{RecoverError, RecoverRequest, SnapshotError};
use crate::service::ApiRole;

/// List query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// At most this many, newest first (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// How long a request waits for its snapshot or recovery.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct WaitParams {
    /// Seconds to wait for the end (default and at most 240, under the server's 300 s request
    /// timeout); not done by then: 202 with the record as it is, to be followed with a GET.
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

/// The longest a request waits before answering 202.
pub const MAX_WAIT_SECONDS: u64 = 240;

fn wait_of(q: &WaitParams) -> Result<std::time::Duration, ApiError> {
    let w = q.wait_seconds.unwrap_or(MAX_WAIT_SECONDS);
    if w > MAX_WAIT_SECONDS {
        return Err(ApiError::bad_field(
            "wait_seconds",
            format!("{w} is more than {MAX_WAIT_SECONDS} (the request timeout is 300 s): wait less and follow the answer's record with GET"),
        ));
    }
    Ok(std::time::Duration::from_secs(w))
}

/// Wait for `task` at most `wait`; then, unless it ended, for what it sends on `started` (sent
/// once its record is written): `Ok(result)` when it ended, `Err(started)` to answer 202 with.
async fn ended_or_started<T, S>(
    mut task: tokio::task::JoinHandle<T>,
    started: tokio::sync::oneshot::Receiver<S>,
    wait: std::time::Duration,
) -> Result<Result<T, ApiError>, S> {
    let joined = |r: Result<T, tokio::task::JoinError>| {
        r.map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("the task ended: {e}"),
            )
        })
    };
    tokio::select! {
        r = &mut task => return Ok(joined(r)),
        () = tokio::time::sleep(wait) => {}
    }
    // Not done in time: its record once written (or its end, if that comes first). It runs on
    // in its own task whatever the client does.
    tokio::select! {
        biased;
        r = &mut task => Ok(joined(r)),
        s = started => match s {
            Ok(s) => Err(s),
            Err(_) => Ok(joined(task.await)),
        },
    }
}

/// A recovery request.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecoverBody {
    /// The snapshot to restore (a verified one of this cluster).
    pub snapshot: Uuid,
    /// The control plane to restore on (host name, id or address); default: the first whose
    /// etcd waits for a bootstrap.
    #[serde(default)]
    pub node: Option<String>,
    /// Recover although etcd still has quorum (needs `confirm`).
    #[serde(default)]
    pub force: bool,
    /// The cluster's name, typed, to confirm `force`.
    #[serde(default)]
    pub confirm: Option<String>,
}

fn snapshot_error(e: SnapshotError) -> ApiError {
    match e {
        e @ SnapshotError::NotPossible(_) => {
            ApiError::new(StatusCode::CONFLICT, "snapshot_not_possible", e.to_string())
        }
        e @ SnapshotError::Busy(_) => {
            ApiError::new(StatusCode::CONFLICT, "snapshot_in_progress", e.to_string())
        }
        e @ SnapshotError::Failed { .. } => {
            ApiError::new(StatusCode::BAD_GATEWAY, "snapshot_failed", e.to_string())
        }
        SnapshotError::Service(s) => s.into(),
    }
}

fn recover_error(e: RecoverError) -> ApiError {
    match e {
        e @ RecoverError::QuorumHeld(_) => {
            ApiError::new(StatusCode::CONFLICT, "quorum_held", e.to_string())
        }
        e @ RecoverError::Already(_) => {
            ApiError::new(StatusCode::CONFLICT, "already_recovered", e.to_string())
        }
        e @ RecoverError::NotPossible(_) => {
            ApiError::new(StatusCode::CONFLICT, "recover_not_possible", e.to_string())
        }
        e @ RecoverError::Failed { .. } => {
            ApiError::new(StatusCode::BAD_GATEWAY, "recover_failed", e.to_string())
        }
        RecoverError::Service(s) => s.into(),
    }
}

/// Take an etcd snapshot of the cluster now: streamed from a healthy control plane, encrypted,
/// stored, read back and verified, then retention applied. 201 with the verified snapshot; 202
/// with the snapshot `taking` when it is not done within `wait_seconds` (follow it with
/// `GET .../snapshots/{id}`); 409 when the cluster declares no `etcdSnapshots`, has no healthy
/// control plane, or one is being taken; 502 when it failed (recorded, with an event).
#[utoipa::path(post, path = "/api/v1/clusters/{name}/snapshots", tag = "clusters",
    params(WaitParams, ("name" = String, Path, description = "cluster name")),
    responses((status = 201, body = SnapshotRecord), (status = 202, body = SnapshotRecord), (status = 409, body = ErrorEnvelope), (status = 502, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn take(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    QueryParams(q): QueryParams<WaitParams>,
) -> Result<(StatusCode, Json<SnapshotRecord>), ApiError> {
    caller.require(ApiRole::Operator)?;
    let wait = wait_of(&q)?;
    // Its own task: a client that gives up (or the request timeout) does not cut a snapshot
    // short; it finishes and is recorded either way.
    let (snapshots, actor, cluster) = (s.snapshots.clone(), caller.actor(), name.clone());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move { snapshots.take_notify(&cluster, &actor, Some(tx)).await });
    match ended_or_started(task, rx, wait).await {
        Ok(r) => r?
            .map(|r| (StatusCode::CREATED, Json(r)))
            .map_err(snapshot_error),
        // (Its record may already show its end if it ended a moment ago: the 202 says the
        // request did not wait for it; the record says what it is.)
        Err(id) => Ok((
            StatusCode::ACCEPTED,
            Json(s.snapshots.get(&name, id).await?),
        )),
    }
}

/// The cluster's etcd snapshots, newest first (every state: taking, verified, failed, deleted).
#[utoipa::path(get, path = "/api/v1/clusters/{name}/snapshots", tag = "clusters", params(ListParams,
    ("name" = String, Path, description = "cluster name")),
    responses((status = 200, body = [SnapshotRecord]), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    QueryParams(q): QueryParams<ListParams>,
) -> Result<Json<Vec<SnapshotRecord>>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    Ok(Json(s.snapshots.list(&name, q.limit.unwrap_or(100)).await?))
}

/// One etcd snapshot of the cluster.
#[utoipa::path(get, path = "/api/v1/clusters/{name}/snapshots/{id}", tag = "clusters",
    params(("name" = String, Path, description = "cluster name"), ("id" = Uuid, Path, description = "snapshot id")),
    responses((status = 200, body = SnapshotRecord), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn show(
    State(s): State<AppState>,
    caller: Caller,
    Path((name, id)): Path<(String, String)>,
) -> Result<Json<SnapshotRecord>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let id = Uuid::parse_str(&id)
        .map_err(|_| ApiError::bad_field("id", format!("`{id}` is not a snapshot id (a UUID)")))?;
    Ok(Json(s.snapshots.get(&name, id).await?))
}

/// Recover the cluster's etcd from a snapshot (Talos' procedure after losing the control plane's
/// majority): one control plane whose etcd waits for a bootstrap receives the snapshot and
/// bootstraps from it; the others rejoin. The cluster's one permitted re-bootstrap. Admins only;
/// 409 while etcd still has quorum (unless `force` with the cluster's name in `confirm`), or when
/// the cluster was recovered before. 202 with the recovery `calling` when it is not done within
/// `wait_seconds`: follow it with `GET .../recovery` (404 again if it failed before anything
/// reached the node: the claim is given back, and the event `cluster.recovery_refused` says why).
#[utoipa::path(post, path = "/api/v1/clusters/{name}/recover", tag = "clusters", request_body = RecoverBody,
    params(WaitParams, ("name" = String, Path, description = "cluster name")),
    responses((status = 200, body = RecoveryRecord), (status = 202, body = RecoveryRecord), (status = 409, body = ErrorEnvelope), (status = 502, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn recover(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    QueryParams(q): QueryParams<WaitParams>,
    JsonBody(body): JsonBody<RecoverBody>,
) -> Result<(StatusCode, Json<RecoveryRecord>), ApiError> {
    caller.require(ApiRole::Admin)?;
    let wait = wait_of(&q)?;
    let req = RecoverRequest {
        snapshot: body.snapshot,
        node: body.node,
        force: body.force,
        confirm: body.confirm,
    };
    let (snapshots, actor) = (s.snapshots.clone(), caller.actor());
    let (tx, rx) = tokio::sync::oneshot::channel();
    // Its own task: once claimed, a recovery runs to its end whatever the client does.
    let task = tokio::spawn(async move {
        snapshots
            .recover_notify(&name, &req, &actor, Some(tx))
            .await
    });
    match ended_or_started(task, rx, wait).await {
        Ok(r) => r?.map(|r| (StatusCode::OK, Json(r))).map_err(recover_error),
        Err(claimed) => Ok((StatusCode::ACCEPTED, Json(claimed))),
    }
}

/// The cluster's recovery from a snapshot (404 while never made).
#[utoipa::path(get, path = "/api/v1/clusters/{name}/recovery", tag = "clusters",
    params(("name" = String, Path, description = "cluster name")),
    responses((status = 200, body = RecoveryRecord), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn recovery(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<RecoveryRecord>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    match s.snapshots.recovery(&name).await? {
        Some(r) => Ok(Json(r)),
        None => Err(
            crate::service::ServiceError::NotFound(format!("recovery of cluster {name}")).into(),
        ),
    }
}

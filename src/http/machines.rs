//! `/api/v1/machines`: register, show, edit (`If-Match`), remove (refused mid-reinstall unless
//! forced), list with filters and keyset pagination, look up by a unique value, bulk import,
//! where a machine stands (`/status`); and `/api/v1/events`.

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ErrorEnvelope};
use super::extract::{body_bytes, if_match, Caller, JsonBody, QueryParams};
use super::AppState;
use crate::domain::import::{self, ImportFormat};
use crate::domain::{LifecycleState, Machine, MachineId, MachineSpec, Role, UniqueKey};
use crate::service::{ApiRole, Event, EventFilter, MachineFilter, MachinePage};

fn with_etag(status: StatusCode, m: &Machine) -> Response {
    answer(status, m, m)
}

/// `body` with the ETag (and, for 201, the Location) of machine `m`.
fn answer<T: Serialize>(status: StatusCode, body: &T, m: &Machine) -> Response {
    let mut resp = (status, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", m.version)) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    if status == StatusCode::CREATED {
        if let Ok(v) = HeaderValue::from_str(&format!("/api/v1/machines/{}", m.id)) {
            resp.headers_mut().insert(header::LOCATION, v);
        }
    }
    resp
}

/// A machine after an edit, with what the edit did besides (e.g. a BMC password discarded).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EditedMachine {
    /// The machine as stored.
    #[serde(flatten)]
    pub machine: Machine,
    /// Side effects in words; absent when there were none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notices: Vec<String>,
}

fn parse_opt<T: std::str::FromStr<Err = String>>(
    field: &str,
    v: &Option<String>,
) -> Result<Option<T>, ApiError> {
    v.as_deref()
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<T>().map_err(|e| ApiError::bad_field(field, e)))
        .transpose()
}

/// Register a machine.
#[utoipa::path(post, path = "/api/v1/machines", request_body = MachineSpec, tag = "machines",
    responses((status = 201, body = Machine, description = "registered; ETag carries the version"),
              (status = 400, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope, description = "a unique value belongs to another machine"),
              (status = 422, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn create(
    State(s): State<AppState>,
    caller: Caller,
    JsonBody(spec): JsonBody<MachineSpec>,
) -> Result<Response, ApiError> {
    caller.require(ApiRole::Operator)?;
    let m = s.inventory.create(spec, &caller.actor()).await?;
    tracing::info!(machine = %m.id, name = %m.display_name(), actor = %caller.actor(), "machine registered");
    if m.bmc.is_some() {
        // Best effort, after the answer: a failed probe is recorded, the registration stands.
        s.bmc.probe_in_background(m.id, &caller.actor());
    }
    Ok(with_etag(StatusCode::CREATED, &m))
}

/// One machine, by inventory id or host name.
#[utoipa::path(get, path = "/api/v1/machines/{id}", tag = "machines",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = Machine), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn show(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let m = s.inventory.resolve(&id).await?;
    Ok(with_etag(StatusCode::OK, &m))
}

/// Edit a machine with a JSON merge patch (RFC 7386). Send the version as `If-Match` (or as
/// `version` in the body); a stale version gets 412 and changes nothing. Moving `bmc.url` to
/// another origin (scheme, host or port) discards the stored BMC password unless the same patch
/// sets `bmc.password`; the answer's `notices` say so.
#[utoipa::path(patch, path = "/api/v1/machines/{id}", tag = "machines", request_body(content = Object, description = "fields to change; null clears"),
    params(("id" = String, Path, description = "inventory id or host name"), ("If-Match" = Option<String>, Header, description = "the machine's ETag")),
    responses((status = 200, body = EditedMachine), (status = 409, body = ErrorEnvelope), (status = 412, body = ErrorEnvelope, description = "stale version"),
              (status = 428, body = ErrorEnvelope, description = "no version sent"), (status = 422, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn update(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(patch): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    caller.require(ApiRole::Operator)?;
    let version = if_match(&headers)?;
    let current = s.inventory.resolve(&id).await?;
    let edited = s
        .inventory
        .edit(current.id, version, patch, &caller.actor())
        .await?;
    let m = edited.machine;
    tracing::info!(machine = %m.id, name = %m.display_name(), version = m.version, actor = %caller.actor(), "machine updated");
    if m.bmc.is_some() && m.bmc != current.bmc {
        s.bmc.probe_in_background(m.id, &caller.actor());
    }
    let body = EditedMachine {
        machine: m,
        notices: edited.notices,
    };
    Ok(answer(StatusCode::OK, &body, &body.machine))
}

/// Options of a removal.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct RemoveParams {
    /// Remove a machine with a running reinstall: cancel it first (recorded), then remove.
    #[serde(default)]
    pub force: bool,
}

/// Remove a machine. Needs `If-Match`. A machine with a running reinstall is refused (409, naming
/// how to cancel it) unless `force=true`.
#[utoipa::path(delete, path = "/api/v1/machines/{id}", tag = "machines",
    params(("id" = String, Path, description = "inventory id or host name"), ("If-Match" = String, Header, description = "the machine's ETag"), RemoveParams),
    responses((status = 204, description = "removed"), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope, description = "a reinstall is running"), (status = 412, body = ErrorEnvelope), (status = 428, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn remove(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    QueryParams(p): QueryParams<RemoveParams>,
) -> Result<StatusCode, ApiError> {
    caller.require(ApiRole::Operator)?;
    let version = if_match(&headers)?;
    let current = s.inventory.resolve(&id).await?;
    s.workflows
        .remove(current.id, version, p.force, &caller.actor())
        .await?;
    tracing::info!(machine = %current.id, name = %current.display_name(), actor = %caller.actor(), "machine removed");
    s.bmc.forget(current.id);
    Ok(StatusCode::NO_CONTENT)
}

/// A state change.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StateChange {
    /// The state to move to.
    pub state: LifecycleState,
    /// Why (required for `failed`).
    #[serde(default)]
    pub reason: Option<String>,
    /// Let the cluster's reinstall policy act on this change (a monitor marking a machine failed
    /// for it to be reinstalled). By default a state set through the API is a person's decision
    /// and the automatic reinstall leaves the machine alone (`manual_hold`).
    #[serde(default)]
    pub auto_reinstall: bool,
}

/// Move a machine along its lifecycle (accept a discovered machine, mark one failed, put it in
/// maintenance...). A change the lifecycle does not allow is a 409 naming the current state; asking
/// for the current state again changes nothing. `If-Match` is honoured when sent.
#[utoipa::path(post, path = "/api/v1/machines/{id}/state", tag = "machines", request_body = StateChange,
    params(("id" = String, Path, description = "inventory id or host name"), ("If-Match" = Option<String>, Header, description = "the machine's ETag")),
    responses((status = 200, body = Machine), (status = 409, body = ErrorEnvelope, description = "not allowed from the current state"),
              (status = 412, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn set_state(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(change): JsonBody<StateChange>,
) -> Result<Response, ApiError> {
    caller.require(ApiRole::Operator)?;
    let version = if_match(&headers)?;
    let current = s.inventory.resolve(&id).await?;
    let m = s
        .inventory
        .set_state_held(
            current.id,
            version,
            change.state,
            change.reason,
            &caller.actor(),
            !change.auto_reinstall,
        )
        .await?;
    tracing::info!(machine = %m.id, name = %m.display_name(), from = %current.state, to = %m.state, actor = %caller.actor(), "machine state");
    Ok(with_etag(StatusCode::OK, &m))
}

/// Filters of the machine list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Lifecycle state.
    pub state: Option<String>,
    /// Site.
    pub site: Option<String>,
    /// Rack.
    pub rack: Option<String>,
    /// Cluster.
    pub cluster: Option<String>,
    /// Role: control-plane or worker.
    pub role: Option<String>,
    /// Free text: host name, serial, asset tag, manufacturer, model, site, rack, cluster, MAC or IP.
    pub q: Option<String>,
    /// Page size, 1-1000 (default 100).
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// List machines.
#[utoipa::path(get, path = "/api/v1/machines", tag = "machines", params(ListParams),
    responses((status = 200, body = MachinePage), (status = 400, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    QueryParams(p): QueryParams<ListParams>,
) -> Result<Json<MachinePage>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let limit = p.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_field("limit", "must be between 1 and 1000"));
    }
    let after = p
        .cursor
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(|c| {
            c.parse::<MachineId>()
                .map_err(|_| ApiError::bad_field("cursor", "not a cursor from a previous page"))
        })
        .transpose()?;
    let filter = MachineFilter {
        state: parse_opt::<LifecycleState>("state", &p.state)?,
        site: p.site,
        rack: p.rack,
        cluster: p.cluster,
        role: parse_opt::<Role>("role", &p.role)?,
        q: p.q,
        limit,
        after,
    };
    Ok(Json(s.inventory.list(&filter).await?))
}

/// Look-up keys: exactly one.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LookupParams {
    /// NIC MAC address.
    pub mac: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// Asset tag.
    pub asset_tag: Option<String>,
    /// SMBIOS UUID.
    pub uuid: Option<String>,
    /// Host name.
    pub hostname: Option<String>,
    /// Reserved IPv4 address.
    pub ipv4: Option<String>,
}

/// Find one machine by MAC, serial, asset tag, SMBIOS UUID, host name or IPv4.
#[utoipa::path(get, path = "/api/v1/machines/lookup", tag = "machines", params(LookupParams),
    responses((status = 200, body = Machine), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn lookup(
    State(s): State<AppState>,
    caller: Caller,
    QueryParams(p): QueryParams<LookupParams>,
) -> Result<Response, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let mut keys = Vec::new();
    if let Some(v) = p.mac {
        keys.push(UniqueKey::Mac(v.parse().map_err(
            |e: crate::domain::mac::MacParseError| ApiError::bad_field("mac", e.to_string()),
        )?));
    }
    if let Some(v) = p.serial {
        keys.push(UniqueKey::Serial(v.trim().to_string()));
    }
    if let Some(v) = p.asset_tag {
        keys.push(UniqueKey::AssetTag(v.trim().to_string()));
    }
    if let Some(v) = p.uuid {
        keys.push(UniqueKey::SmbiosUuid(
            v.trim()
                .parse()
                .map_err(|_| ApiError::bad_field("uuid", "not a UUID"))?,
        ));
    }
    if let Some(v) = p.hostname {
        keys.push(UniqueKey::Hostname(v.trim().to_ascii_lowercase()));
    }
    if let Some(v) = p.ipv4 {
        keys.push(UniqueKey::Ipv4(v.trim().parse().map_err(|_| {
            ApiError::bad_field("ipv4", "not an IPv4 address")
        })?));
    }
    let [key] = keys.as_slice() else {
        return Err(ApiError::bad_field(
            "query",
            "give exactly one of mac, serial, asset_tag, uuid, hostname, ipv4",
        ));
    };
    let m = s.inventory.lookup(key).await?;
    Ok(with_etag(StatusCode::OK, &m))
}

/// Import format selector.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ImportParams {
    /// `csv` or `json`; default from Content-Type.
    pub format: Option<String>,
    /// `mac`, `serial` or `hostname`: a row whose value of this key belongs to a machine replaces
    /// that machine (state, id and history kept); other rows are created. One transaction.
    pub update: Option<String>,
}

/// Result of an import.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ImportResult {
    /// Machines created.
    pub imported: usize,
    /// Their ids, in file order.
    pub ids: Vec<MachineId>,
    /// With `update`: machines replaced by their row, in file order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated: Option<Vec<MachineId>>,
    /// With `update`: rows that matched a machine already like them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unchanged: Option<usize>,
}

/// Import many machines from CSV (`text/csv`) or a JSON array (`application/json`) as one
/// transaction: either every row is imported, or none and every bad row is listed with its line
/// (the first 1,000). The rows are checked and written off the runtime threads, streamed in
/// batches (`Inventory::import`).
#[utoipa::path(post, path = "/api/v1/machines/import", tag = "machines", params(ImportParams),
    request_body(content = String, description = "CSV with a header row, or a JSON array of machines", content_type = "text/csv"),
    responses((status = 200, body = ImportResult), (status = 413, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope, description = "bad rows; nothing imported")),
    security(("bearer" = [])))]
pub async fn import(
    State(s): State<AppState>,
    caller: Caller,
    QueryParams(p): QueryParams<ImportParams>,
    req: Request,
) -> Result<Json<ImportResult>, ApiError> {
    caller.require(ApiRole::Operator)?;
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let format = match p.format.as_deref() {
        Some("csv") => ImportFormat::Csv,
        Some("json") => ImportFormat::Json,
        Some(other) => {
            return Err(ApiError::bad_field(
                "format",
                format!("`{other}` is not csv or json"),
            ))
        }
        None if ct.starts_with("text/csv") => ImportFormat::Csv,
        None if ct.starts_with("application/json") => ImportFormat::Json,
        None => {
            return Err(ApiError::bad_field(
                "Content-Type",
                "send text/csv or application/json, or say ?format=csv|json",
            ))
        }
    };
    let update_key = match p.update.as_deref() {
        None => None,
        Some(k) => Some(
            k.parse::<import::ImportKey>()
                .map_err(|e| ApiError::bad_field("update", e))?,
        ),
    };
    let bytes = body_bytes(req, &s).await?;
    tracing::info!(bytes = bytes.len(), format = ?format, update = update_key.is_some(),
        actor = %caller.actor(), "import started");
    let out = s
        .inventory
        .import(format, Vec::from(bytes), update_key, &caller.actor())
        .await?;
    tracing::info!(created = out.created.len(), updated = out.updated.len(),
        unchanged = out.unchanged, update = update_key.is_some(), actor = %caller.actor(), "import applied");
    let with_update = update_key.is_some();
    Ok(Json(ImportResult {
        imported: out.created.len(),
        ids: out.created,
        updated: with_update.then_some(out.updated),
        unchanged: with_update.then_some(out.unchanged),
    }))
}

/// Event filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct EventParams {
    /// Machine id or host name.
    pub machine: Option<String>,
    /// Kind prefix, e.g. `machine.`.
    pub kind: Option<String>,
    /// Only events after this id (for following the log).
    pub after: Option<i64>,
    /// At most this many, 1-10000 (default 100): the newest, oldest first.
    pub limit: Option<u32>,
}

/// Read the event log.
#[utoipa::path(get, path = "/api/v1/events", tag = "events", params(EventParams),
    responses((status = 200, body = Vec<Event>), (status = 400, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn events(
    State(s): State<AppState>,
    caller: Caller,
    QueryParams(p): QueryParams<EventParams>,
) -> Result<Json<Vec<Event>>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let machine_id = match p.machine.as_deref() {
        Some(m) => Some(s.inventory.resolve(m).await?.id),
        None => None,
    };
    let limit = p.limit.unwrap_or(100);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::bad_field("limit", "must be between 1 and 10000"));
    }
    let filter = EventFilter {
        machine_id,
        kind_prefix: p.kind,
        after_id: p.after,
        limit,
    };
    Ok(Json(s.inventory.events(&filter).await?))
}

/// A machine's id and host name.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StatusMachine {
    /// Inventory id.
    pub id: MachineId,
    /// Host name.
    pub hostname: Option<String>,
}

/// Where a machine stands, in one answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MachineStatus {
    /// The machine's id and host name.
    pub machine: StatusMachine,
    /// Lifecycle state.
    pub state: LifecycleState,
    /// Why it is in that state.
    pub state_reason: Option<String>,
    /// Who set the state.
    pub state_by: Option<String>,
    /// A person set the state: the automatic reinstall keeps off.
    pub manual_hold: bool,
    /// The current or last reinstall: its stage and the stage's deadline.
    pub reinstall: Option<crate::service::Reinstall>,
    /// Why its last boot waits, when its last boot plan held (image not cached, window closed,
    /// waiting to be accepted...).
    pub waiting: Option<String>,
    /// The last DHCP step.
    pub last_dhcp: Option<Event>,
    /// The last boot step (DHCP, TFTP, HTTP, boot script, config).
    pub last_boot_step: Option<Event>,
    /// The provisioning window.
    pub window: Option<crate::service::ProvisionWindow>,
    /// Whether the window is open now.
    pub window_open: bool,
    /// Whether the machine's config renders and validates.
    pub config_valid: bool,
    /// The power state the BMC reports (`on`, `off`...); none without a BMC.
    pub power: Option<String>,
    /// Why the power state is unknown (the BMC did not answer in 5 s, refused, failed).
    pub power_error: Option<String>,
}

/// Where a machine stands: its state and who set it, its reinstall's stage and deadline, why its
/// boot waits, its last DHCP exchange and boot step, its provisioning window and its power state
/// (asked from its BMC, at most 5 s).
#[utoipa::path(get, path = "/api/v1/machines/{id}/status", tag = "machines",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = MachineStatus), (status = 404, body = ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn status(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<MachineStatus>, ApiError> {
    caller.require(ApiRole::Viewer)?;
    let m = s.inventory.resolve(&id).await?;
    let reinstall = s.workflows.status(m.id).await?;
    let steps = s.provisioning.timeline_of(m.id).await?;
    let config = s.configs.status(&m).await?;
    let last = |prefixes: &[&str]| {
        steps
            .iter()
            .rev()
            .find(|e| prefixes.iter().any(|p| e.kind.starts_with(p)))
            .cloned()
    };
    let waiting = last(&["boot.script", "boot.discovered"]).and_then(|e| {
        e.detail
            .get("reason")
            .and_then(|r| r.as_str())
            .map(str::to_string)
    });
    let (power, power_error) = if m.bmc.is_some() {
        let asked = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            s.bmc.power_state(&m.id.to_string()),
        )
        .await;
        match asked {
            Ok(Ok(r)) => (Some(r.power_state), None),
            Ok(Err(e)) => (None, Some(e.to_string())),
            Err(_) => (None, Some("the BMC did not answer within 5 s".into())),
        }
    } else {
        (None, None)
    };
    Ok(Json(MachineStatus {
        machine: StatusMachine {
            id: m.id,
            hostname: m.hostname.clone(),
        },
        state: m.state,
        state_reason: m.state_reason.clone(),
        state_by: m.state_by.clone(),
        manual_hold: m.manual_hold,
        reinstall,
        waiting,
        last_dhcp: last(&["dhcp."]),
        last_boot_step: last(&["dhcp.", "tftp.", "http.", "boot.", "config."]),
        window: config.window,
        window_open: config.window_open,
        config_valid: config.valid,
        power,
        power_error,
    }))
}

//! Network-boot routes, translated to the provisioning service: `/boot.ipxe` (the generic first
//! script), `/boot/machine.ipxe` (this machine's script), `/ipxe/{file}` (iPXE binaries for UEFI
//! HTTP boot), `/images/{schematic}/{version}/{file}` (the Talos image cache) and the API's
//! `/api/v1/machines/{id}/timeline`. Each handler decodes the request, asks
//! `ProvisioningService`, and encodes the answer: a service fault is a 5xx, never a 404.
//!
//! No token: firmware cannot carry one. Nothing secret is served here.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::service::provisioning::{
    BootIdentity, FileRefusal, ImageRefusal, ImageRequest, ScriptOutcome, ScriptRequest,
};

fn host(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::HOST).and_then(|h| h.to_str().ok())
}

fn script(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// `GET /boot.ipxe`.
pub async fn generic(State(s): State<AppState>, headers: HeaderMap) -> Response {
    script(
        StatusCode::OK,
        s.provisioning.generic_script(host(&headers)),
    )
}

/// `GET /boot/machine.ipxe?mac=..&uuid=..`.
pub async fn machine(
    State(s): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Query(who): Query<BootIdentity>,
) -> Response {
    let answer = s
        .provisioning
        .machine_script(&ScriptRequest {
            who,
            peer: peer.ip(),
            host: host(&headers).map(str::to_string),
        })
        .await;
    let status = match answer.outcome {
        ScriptOutcome::Served => StatusCode::OK,
        ScriptOutcome::BadRequest => StatusCode::BAD_REQUEST,
        ScriptOutcome::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ScriptOutcome::Deferred => StatusCode::TOO_MANY_REQUESTS,
    };
    script(status, answer.script)
}

/// A machine's boot timeline: every DHCP, TFTP and HTTP step and config fetch seen for it, with
/// the state changes and reinstall stages between them, oldest first.
#[utoipa::path(get, path = "/api/v1/machines/{id}/timeline", tag = "machines",
    params(("id" = String, Path, description = "inventory id or host name")),
    responses((status = 200, body = Vec<crate::service::Event>), (status = 404, body = super::error::ErrorEnvelope)),
    security(("bearer" = [])))]
pub async fn timeline(
    State(s): State<AppState>,
    caller: super::extract::Caller,
    Path(id): Path<String>,
) -> Result<axum::Json<Vec<crate::service::Event>>, super::error::ApiError> {
    caller.require(crate::service::ApiRole::Viewer)?;
    let m = s.inventory.resolve(&id).await?;
    Ok(axum::Json(s.provisioning.timeline_of(m.id).await?))
}

/// `GET|HEAD /ipxe/{file}`: iPXE binaries for UEFI HTTP boot. An `.efi` file is sent as
/// `application/efi`, the type the UEFI specification's HTTP boot section gives EFI images (EDK2's
/// HttpBootDxe decides the image type from `Content-Type` first and only then from the URL's
/// extension), always with its exact `Content-Length` (the firmware asks for it with a `HEAD`
/// before the `GET`) and never through a redirect.
pub async fn ipxe_binary(
    State(s): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(file): Path<String>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let whole_get = method == Method::GET && !headers.contains_key(header::RANGE);
    match s.provisioning.ipxe_file(&file, peer.ip(), whole_get).await {
        Ok(p) => {
            let kind = if file.ends_with(".efi") {
                super::files::EFI_IMAGE
            } else {
                super::files::OCTET_STREAM
            };
            super::files::serve_file(&p, None, kind, &method, &headers).await
        }
        Err(FileRefusal::NotFound | FileRefusal::Denied) => StatusCode::NOT_FOUND.into_response(),
        Err(FileRefusal::Unavailable) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The image cache's route, as metrics label it (on either door).
pub(crate) const IMAGE_ROUTE: &str = "/images/{schematic}/{version}/{file}";

/// The status of an image request the service refused.
pub(crate) fn image_refusal(r: ImageRefusal) -> StatusCode {
    match r {
        ImageRefusal::NotFound => StatusCode::NOT_FOUND,
        ImageRefusal::Upstream => StatusCode::BAD_GATEWAY,
        ImageRefusal::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// `GET|HEAD /images/{schematic}/{version}/{file}`.
pub async fn image(
    State(s): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((schematic, version, file)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let r = ImageRequest {
        schematic: &schematic,
        version: &version,
        file: &file,
        peer: peer.ip(),
        whole_get: method == Method::GET && !headers.contains_key(header::RANGE),
    };
    match s.provisioning.image(&r).await {
        Ok(found) => {
            super::files::serve_file(
                &found.path,
                found.sha256,
                super::files::OCTET_STREAM,
                &method,
                &headers,
            )
            .await
        }
        Err(refusal) => image_refusal(refusal).into_response(),
    }
}

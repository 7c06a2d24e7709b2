//! Network-boot endpoints: `/boot.ipxe` (the generic first script), `/boot/machine.ipxe` (this
//! machine's script, decided by one `BootPlan`), `/ipxe/{file}` (iPXE binaries for UEFI HTTP boot)
//! and `/images/{schematic}/{version}/{file}` (the Talos image cache). Unknown machines are
//! registered as discovered with the SMBIOS facts iPXE sends. Every script served is a `boot.*`
//! event of the machine: its boot timeline.
//!
//! No token: firmware cannot carry one. Nothing secret is served here.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::AppState;
use crate::domain::boot::{
    arch_of_buildarch, decide, generic_script, is_placeholder, machine_script, BootPlan,
    InstallAssets,
};
use crate::domain::dhcp::Arch;
use crate::domain::{Interface, LifecycleState, MacAddr, Machine, MachineSpec, UniqueKey};
use crate::images::ImageCache;
use crate::service::{NewEvent, ServiceError};

/// Boot settings.
#[derive(Clone, Debug)]
pub struct BootSettings {
    /// How machines reach this server (`http://10.0.0.1:8080`); default: the request's Host.
    pub public_url: Option<String>,
    /// Directory with the iPXE binaries.
    pub ipxe_dir: Option<PathBuf>,
    /// The image cache.
    pub images: ImageCache,
    /// On-demand downloads from an Image Factory, when configured.
    pub puller: Option<crate::images::ImagePuller>,
    /// Where install plans point kernel and initramfs URLs (`http://10.0.0.1:8081`), when the
    /// sendfile image door is on: `[boot].images_url`, or the base URL with the door's port.
    pub images_door: ImagesDoor,
}

/// Where machines fetch images from.
#[derive(Clone, Debug, Default)]
pub enum ImagesDoor {
    /// This HTTP front door (the base URL).
    #[default]
    Main,
    /// The image door on this port of the base URL's host.
    Port(u16),
    /// The image door at this URL.
    Url(String),
}

impl ImagesDoor {
    /// The base URL of `/images/..` given this front door's base URL.
    pub fn base(&self, main: &str) -> String {
        match self {
            ImagesDoor::Main => main.to_string(),
            ImagesDoor::Url(u) => u.trim_end_matches('/').to_string(),
            ImagesDoor::Port(port) => with_port(main, *port),
        }
    }
}

/// `http://` and the host of `scheme://host[:port][/path]` with the door's port: the image door
/// speaks plain HTTP from its root, whatever proxy fronts the main port.
fn with_port(url: &str, port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = match authority.strip_prefix('[') {
        // An IPv6 literal: `[::1]:8080`.
        Some(v6) => format!("[{}]", v6.split(']').next().unwrap_or(v6)),
        None => authority.split(':').next().unwrap_or(authority).to_string(),
    };
    format!("http://{host}:{port}")
}

fn base_url(s: &AppState, headers: &HeaderMap) -> String {
    if let Some(u) = &s.boot.public_url {
        return u.trim_end_matches('/').to_string();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    format!("http://{host}")
}

fn script(body: String) -> Response {
    (
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
    script(generic_script(&base_url(&s, &headers)))
}

/// What iPXE tells about the machine.
#[derive(Debug, Default, Deserialize)]
pub struct Identity {
    /// Booting NIC's MAC (`${mac:hexhyp}` or colon form).
    pub mac: Option<String>,
    /// SMBIOS UUID.
    pub uuid: Option<String>,
    /// SMBIOS serial.
    pub serial: Option<String>,
    /// SMBIOS manufacturer.
    pub manufacturer: Option<String>,
    /// SMBIOS product.
    pub product: Option<String>,
    /// SMBIOS asset tag.
    pub asset: Option<String>,
    /// `i386`, `x86_64`, `arm64`.
    pub buildarch: Option<String>,
    /// `pcbios` or `efi`.
    pub platform: Option<String>,
}

fn fact(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !is_placeholder(s))
        .map(|s| s.chars().take(255).collect())
}

fn smbios_uuid(v: &Option<String>) -> Option<uuid::Uuid> {
    let u: uuid::Uuid = v.as_deref()?.trim().parse().ok()?;
    (!u.is_nil() && !u.is_max()).then_some(u)
}

/// Find the machine behind a boot request, or register it as discovered.
async fn find_or_discover(
    s: &AppState,
    mac: MacAddr,
    id: &Identity,
) -> Result<(Machine, bool), ServiceError> {
    let inv = &s.inventory;
    if let Ok(m) = inv.lookup(&UniqueKey::Mac(mac)).await {
        return Ok((m, false));
    }
    if let Some(u) = smbios_uuid(&id.uuid) {
        if let Ok(m) = inv.lookup(&UniqueKey::SmbiosUuid(u)).await {
            return Ok((m, false));
        }
    }
    let full = MachineSpec {
        smbios_uuid: smbios_uuid(&id.uuid),
        serial: fact(&id.serial),
        asset_tag: fact(&id.asset),
        manufacturer: fact(&id.manufacturer),
        model: fact(&id.product),
        interfaces: vec![Interface {
            mac,
            ipv4: None,
            boot: true,
            name: None,
        }],
        ..Default::default()
    };
    match inv
        .create_in_state(full.clone(), LifecycleState::Discovered, "boot")
        .await
    {
        Ok(m) => Ok((m, true)),
        Err(ServiceError::Conflict(c)) if c.iter().any(|c| c.field.ends_with(".mac")) => {
            // Another request registered this MAC a moment ago.
            Ok((inv.lookup(&UniqueKey::Mac(mac)).await?, false))
        }
        Err(ServiceError::Conflict(c)) => {
            // A serial or asset tag that another machine holds: register without the disputed facts
            // and say so; an operator sorts it out.
            tracing::warn!(%mac, conflicts = ?c.iter().map(ToString::to_string).collect::<Vec<_>>(), "discovered machine shares facts with a known one");
            let bare = MachineSpec {
                serial: None,
                asset_tag: None,
                smbios_uuid: None,
                ..full
            };
            Ok((
                inv.create_in_state(bare, LifecycleState::Discovered, "boot")
                    .await?,
                true,
            ))
        }
        Err(e) => Err(e),
    }
}

/// What an install boot of `m` loads: the cached kernel and initramfs of its cluster's Talos
/// version and schematic, and its config URL with a token minted for this boot. `Ok(None)`: no
/// provisioning window is open; `Err`: why it cannot install yet (shown on the console).
async fn install_assets(
    s: &AppState,
    m: &Machine,
    arch: Arch,
    base: &str,
) -> Result<Option<InstallAssets>, String> {
    let ticket = match s.configs.install_ticket(m).await {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(None),
        Err(e) => {
            tracing::warn!(machine = %m.id, error = %e, "boot: the machine's config does not render");
            return Err(format!("the machine config does not render: {e}"));
        }
    };
    let (kernel, initramfs) = (
        crate::images::kernel_name(arch),
        crate::images::initramfs_name(arch),
    );
    for f in [&kernel, &initramfs] {
        match s
            .boot
            .images
            .path(&ticket.schematic_id, &ticket.talos_version, f)
        {
            Ok(Some(_)) => {}
            _ => {
                let Some(puller) = s.boot.puller.clone() else {
                    return Err(format!(
                        "Talos {} {f} of schematic {} is not in the image cache: plinth image import or pull it",
                        ticket.talos_version, ticket.schematic_id
                    ));
                };
                // One download however many machines ask; they hold and poll meanwhile.
                let (schematic, version, name) = (
                    ticket.schematic_id.clone(),
                    ticket.talos_version.clone(),
                    f.clone(),
                );
                tokio::spawn(async move {
                    if let Err(e) = puller.ensure(&schematic, &version, &name, None).await {
                        tracing::warn!(error = %e, "image pull failed");
                    }
                });
                return Err(format!(
                    "Talos {} {f} of schematic {} is not in the image cache yet: downloading it from {}",
                    ticket.talos_version,
                    ticket.schematic_id,
                    s.boot.puller.as_ref().map(|p| p.factory()).unwrap_or_default()
                ));
            }
        }
    }
    let images = format!(
        "{}/images/{}/{}",
        s.boot.images_door.base(base),
        ticket.schematic_id,
        ticket.talos_version
    );
    Ok(Some(InstallAssets {
        kernel_url: format!("{images}/{kernel}"),
        initramfs_url: format!("{images}/{initramfs}"),
        // Talos substitutes ${uuid} in the query string only (iPXE may already have).
        config_url: format!(
            "{base}/config/{}?token={}&uuid=${{uuid}}",
            m.id, ticket.token
        ),
        extra_args: ticket.kernel_args,
        wipe: ticket.wipe,
    }))
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
    let all = s
        .inventory
        .events(&crate::service::EventFilter {
            machine_id: Some(m.id),
            kind_prefix: None,
            after_id: None,
            limit: 10_000,
        })
        .await?;
    const STEPS: &[&str] = &[
        "dhcp.",
        "tftp.",
        "http.",
        "boot.",
        "config.",
        "reinstall.",
        "machine.state",
    ];
    Ok(axum::Json(
        all.into_iter()
            .filter(|e| STEPS.iter().any(|p| e.kind.starts_with(p)))
            .collect(),
    ))
}

/// `GET /boot/machine.ipxe?mac=..&uuid=..`.
pub async fn machine(
    State(s): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Query(id): Query<Identity>,
) -> Response {
    let base = base_url(&s, &headers);
    let Some(mac) = id.mac.as_deref().and_then(|m| m.parse::<MacAddr>().ok()) else {
        return (
            StatusCode::BAD_REQUEST,
            "#!ipxe\necho Plinth: the boot request carries no MAC address\nsleep 10\n",
        )
            .into_response();
    };
    let arch = id
        .buildarch
        .as_deref()
        .and_then(arch_of_buildarch)
        .unwrap_or(Arch::Amd64);
    let (m, discovered) = match find_or_discover(&s, mac, &id).await {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, %mac, "boot: machine look-up failed");
            // A fault is a 5xx: iPXE's generic script retries.
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "#!ipxe\necho Plinth: inventory unavailable\n",
            )
                .into_response();
        }
    };
    let install = if m.state == LifecycleState::Provisioning {
        install_assets(&s, &m, arch, &base).await
    } else {
        Ok(None)
    };
    let plan = match install {
        Ok(assets) => decide(&m, assets),
        Err(reason) => BootPlan::Hold {
            reason,
            retry_secs: 30,
        },
    };
    let self_url = format!(
        "{base}/boot/machine.ipxe?mac={}&uuid={}&buildarch={}&platform={}",
        mac.to_string().replace(':', "-"),
        id.uuid.as_deref().unwrap_or(""),
        id.buildarch.as_deref().unwrap_or(""),
        id.platform.as_deref().unwrap_or("")
    );
    let event = NewEvent {
        machine_id: Some(m.id),
        kind: if discovered {
            "boot.discovered".into()
        } else {
            "boot.script".into()
        },
        actor: "boot".into(),
        detail: serde_json::json!({
            "plan": plan.name(), "mac": mac, "from": peer.ip().to_string(),
            "platform": id.platform, "buildarch": id.buildarch, "state": m.state,
        }),
    };
    if let Err(e) = s.inventory.append_event(&event).await {
        tracing::warn!(error = %e, "boot: timeline event not written");
    }
    tracing::info!(machine = %m.id, %mac, plan = plan.name(), discovered, from = %peer, "boot script");
    script(machine_script(&plan, arch, &self_url))
}

/// `GET|HEAD /ipxe/{file}`: iPXE binaries for UEFI HTTP boot.
pub async fn ipxe_binary(
    State(s): State<AppState>,
    Path(file): Path<String>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let Some(dir) = &s.boot.ipxe_dir else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Ok(root) = std::fs::canonicalize(dir) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match crate::tftp::resolve_in(&root, std::path::Path::new(&file)) {
        Ok(p) => super::files::serve_file(&p, None, &method, &headers).await,
        Err(_) => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The image cache's route, as metrics label it (on either door).
pub(crate) const IMAGE_ROUTE: &str = "/images/{schematic}/{version}/{file}";

/// One request for a file of the image cache.
pub(crate) struct ImageRequest<'a> {
    /// Schematic id.
    pub schematic: &'a str,
    /// Talos version.
    pub version: &'a str,
    /// File name (`kernel-amd64`, `initramfs-amd64.xz`).
    pub file: &'a str,
    /// Who asks.
    pub peer: std::net::IpAddr,
    /// A `GET` of the whole file (not `HEAD`, not a `Range`): a boot step on the timeline.
    pub whole_get: bool,
}

/// Resolve an image request to a cached file and its digest (hex SHA-256, when recorded). A file
/// the cache lacks is pulled first, once for everyone asking, when a factory is configured and a
/// declared cluster uses that schematic and version: a request alone cannot make Plinth fetch
/// anything. Records the `http.image` timeline step of whole downloads. Both image doors (the
/// hyper route and the sendfile listener) answer through this one function.
pub(crate) async fn resolve_image(
    s: &AppState,
    r: &ImageRequest<'_>,
) -> Result<(PathBuf, Option<String>), StatusCode> {
    if r.whole_get {
        if let std::net::IpAddr::V4(ip) = r.peer {
            s.timeline.record(crate::service::timeline::Step {
                kind: "http.image",
                mac: None,
                ip: Some(ip),
                detail: serde_json::json!({"file": r.file, "version": r.version, "schematic": r.schematic}),
            });
        }
    }
    let cached = |s: &AppState| match s.boot.images.path(r.schematic, r.version, r.file) {
        Ok(Some(p)) => {
            let digest = s.boot.images.digest(&p);
            Ok(Some((p, digest)))
        }
        Ok(None) => Ok(None),
        Err(_) => Err(StatusCode::NOT_FOUND),
    };
    if let Some(found) = cached(s)? {
        return Ok(found);
    }
    // Not cached: with a factory configured, fetch it once for everyone asking.
    let Some(puller) = &s.boot.puller else {
        return Err(StatusCode::NOT_FOUND);
    };
    // Only images a declared cluster uses.
    let wanted = match s.configs.sources().await {
        Ok(src) => src
            .clusters
            .values()
            .any(|c| c.spec.schematic_id == r.schematic && c.spec.talos_version == r.version),
        Err(_) => false,
    };
    if !wanted {
        return Err(StatusCode::NOT_FOUND);
    }
    match puller.ensure(r.schematic, r.version, r.file, None).await {
        Ok(_) => cached(s)?.ok_or(StatusCode::NOT_FOUND),
        Err(crate::images::PullError::Refused { .. }) => Err(StatusCode::NOT_FOUND),
        Err(e) => {
            tracing::warn!(error = %e, "image pull failed");
            Err(StatusCode::BAD_GATEWAY)
        }
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
    match resolve_image(&s, &r).await {
        Ok((p, digest)) => super::files::serve_file(&p, digest, &method, &headers).await,
        Err(status) => status.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_door_urls() {
        let main = "http://10.0.0.1:8080";
        assert_eq!(ImagesDoor::Main.base(main), main);
        assert_eq!(ImagesDoor::Port(8081).base(main), "http://10.0.0.1:8081");
        assert_eq!(
            ImagesDoor::Port(8081).base("https://boot.example/plinth"),
            "http://boot.example:8081"
        );
        assert_eq!(
            ImagesDoor::Port(81).base("http://[fd00::1]:8080"),
            "http://[fd00::1]:81"
        );
        assert_eq!(
            ImagesDoor::Url("http://10.0.0.2:9000/".into()).base(main),
            "http://10.0.0.2:9000"
        );
    }
}

//! Provisioning: the one answer to "what should this machine boot now, and with what?".
//!
//! DHCP, TFTP, the HTTP boot routes and the image door are translators: they decode their
//! protocol, ask this service, and encode its answer. The service owns:
//! - who is asking (`identity`): a MAC, an SMBIOS UUID or only an address, resolved to a machine
//!   of the inventory, and the discovery of unknown machines;
//! - DHCP's answer (`dhcp`): the lease, and the boot file for the client's firmware;
//! - the boot files (`files`): the iPXE binaries TFTP and `/ipxe/` serve;
//! - the boot plan (`plan`): install, local disk, discovery or hold with its reason, the install
//!   ticket (the boot's config token) and the iPXE script that carries it out;
//! - the Talos image each plan needs and its pull policy (`images`);
//! - the boot timeline (`timeline`): every step, attributed to its machine;
//! - why machines wait (`waiting`): held boots with their reason, the image cache per cluster.
//!
//! Imports `domain`, the ports and the other use cases of `service`; never a front door, a store
//! or a concrete client (`app` wires those in).

pub mod dhcp;
mod files;
mod identity;
mod images;
mod plan;
pub mod timeline;
mod waiting;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

pub use files::{resolve_in, BootFiles, FileRefusal};
pub use identity::{BootIdentity, DiscoveryLimits, Identities};
pub use images::{pull_command, ImageRefusal, ImageRequest};
pub use plan::{ScriptAnswer, ScriptOutcome, ScriptRequest};
pub use waiting::{ArchImage, ClusterImage, Held, Holds};

use self::dhcp::{DhcpRequest, DhcpService, Outcome, ReplyKind};
use self::timeline::{Step, Timeline};
use super::ports::StoreError;
use super::ports::TalosImages;
use super::{ConfigService, Inventory};

/// Where install plans point machines for kernel and initramfs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ImagesDoor {
    /// The main HTTP front door (the base URL).
    #[default]
    Main,
    /// The image door on this port of the base URL's host.
    Port(u16),
    /// The image door at this URL.
    Url(String),
}

impl ImagesDoor {
    /// The base URL of `/images/..` given the main front door's base URL.
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

/// Network-boot settings.
#[derive(Clone, Debug, Default)]
pub struct BootSettings {
    /// How machines reach the HTTP front door (`http://10.0.0.1:8080`); default: the request's
    /// `Host`.
    pub public_url: Option<String>,
    /// Where install plans point kernel and initramfs URLs.
    pub images_door: ImagesDoor,
}

/// What the service is built from.
pub struct Parts {
    /// The inventory use cases.
    pub inventory: Inventory,
    /// Machine configs, windows and install tickets.
    pub configs: ConfigService,
    /// The event log (boot scripts served).
    pub events: Arc<dyn super::ports::EventStore>,
    /// Client -> machine resolution, shared with the timeline writer.
    pub identities: Identities,
    /// The boot timeline.
    pub timeline: Timeline,
    /// The Talos image cache and its source.
    pub images: Arc<dyn TalosImages>,
    /// The iPXE binaries.
    pub files: BootFiles,
    /// DHCP's lease engine, when DHCP is on.
    pub dhcp: Option<Arc<DhcpService>>,
    /// Base URLs.
    pub settings: BootSettings,
}

/// The provisioning service (see the module's paragraph). Cheap to clone.
#[derive(Clone)]
pub struct ProvisioningService {
    inner: Arc<Parts>,
    /// Image pulls under way (schematic/version/kernel file), so a poll never starts a second.
    pulls: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Boot-script events per machine, plan and requesting address: a boot asks once or twice,
    /// a flood of anonymous requests (the MAC is all they need) must not bury the timeline.
    scripts: Arc<crate::service::throttle::Budget>,
}

/// Boot-script events of one machine, plan and address written at once...
const SCRIPT_BURST: f64 = 10.0;
/// ...and then per second (one every 6 s; an iPXE retry loop asks every 30 s or more).
const SCRIPT_RATE: f64 = 1.0 / 6.0;

impl std::fmt::Debug for ProvisioningService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProvisioningService")
            .finish_non_exhaustive()
    }
}

impl ProvisioningService {
    /// The service over its parts.
    pub fn new(parts: Parts) -> Self {
        ProvisioningService {
            inner: Arc::new(parts),
            pulls: Arc::default(),
            scripts: Arc::new(crate::service::throttle::Budget::new(
                SCRIPT_RATE,
                SCRIPT_BURST,
            )),
        }
    }

    /// The base URL machines reach the HTTP front door at: the configured public URL, else
    /// `http://` and the `Host` the request came with.
    pub fn base_url(&self, host: Option<&str>) -> String {
        match &self.inner.settings.public_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => format!("http://{}", host.unwrap_or("127.0.0.1")),
        }
    }

    /// Which firmware the iPXE binaries present can boot.
    pub fn bootable(&self) -> Vec<String> {
        self.inner.files.bootable()
    }

    /// Does the inventory know this MAC (in memory, no I/O; see `Identities::is_known`)?
    pub fn is_known(&self, mac: crate::domain::MacAddr) -> bool {
        self.inner.identities.is_known(mac)
    }

    /// Keep the known MACs fresh: read them now, then every `every` until `stop`.
    pub async fn refresh_known_macs(
        &self,
        every: std::time::Duration,
        stop: tokio_util::sync::CancellationToken,
    ) {
        loop {
            match self.inner.identities.refresh_known().await {
                Ok(n) => tracing::debug!(macs = n, "known MACs refreshed"),
                Err(e) => tracing::warn!(error = %e, "known MACs not refreshed"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    /// How full each DHCP subnet's pool is (see `DhcpService::pool_use`); empty when DHCP is off.
    pub async fn pool_use(
        &self,
    ) -> Result<Vec<(Arc<crate::domain::dhcp::Subnet>, u64, u64)>, StoreError> {
        match &self.inner.dhcp {
            Some(d) => d.pool_use().await,
            None => Ok(Vec::new()),
        }
    }

    /// The boot timeline recorder.
    pub fn timeline(&self) -> &Timeline {
        &self.inner.timeline
    }

    /// DHCP: decide the answer to one request (lease committed before an ACK exists) and record
    /// the step on the timeline. `Err` is a store fault: the front door stays silent.
    pub async fn dhcp(&self, req: &DhcpRequest) -> Result<Outcome, StoreError> {
        let Some(engine) = &self.inner.dhcp else {
            return Ok(Outcome::Silent("dhcp_off"));
        };
        let outcome = engine.handle(req).await?;
        if let Outcome::Reply(reply) = &outcome {
            let yiaddr = (!reply.yiaddr.is_unspecified()).then_some(reply.yiaddr);
            if let (ReplyKind::Ack, Some(ip)) = (reply.kind, yiaddr) {
                self.inner.identities.acknowledged(ip, req.mac);
            }
            self.inner.timeline.record(Step {
                kind: match reply.kind {
                    ReplyKind::Offer => "dhcp.offer",
                    ReplyKind::Ack => "dhcp.ack",
                    ReplyKind::Nak => "dhcp.nak",
                },
                mac: Some(req.mac),
                ip: yiaddr,
                machine: None,
                detail: serde_json::json!({
                    "client": req.client.to_string(),
                    "boot_file": reply.boot.as_ref().map(|b| b.file.clone()),
                    "relay": (!req.giaddr.is_unspecified()).then(|| req.giaddr.to_string()),
                    "proxy": req.proxy_port,
                    "interface": req.interface,
                }),
            });
        }
        Ok(outcome)
    }

    /// TFTP: the file a read request from `peer` gets, attributed to the machine at that address
    /// on the timeline. `Unavailable` when the machine cannot be looked up (a store fault).
    pub async fn tftp_file(
        &self,
        peer: IpAddr,
        requested: &str,
    ) -> Result<std::path::PathBuf, FileRefusal> {
        let machine = match peer {
            IpAddr::V4(ip) => self.machine_at(ip).await?,
            IpAddr::V6(_) => None,
        };
        let (path, bytes) = self.boot_file(requested).await?;
        if let IpAddr::V4(ip) = peer {
            self.inner.timeline.record(Step {
                kind: "tftp.read",
                mac: None,
                ip: Some(ip),
                machine,
                detail: serde_json::json!({"file": requested, "bytes": bytes}),
            });
        }
        Ok(path)
    }

    /// A boot file's path and length: remembered from less than a second ago, else resolved on
    /// the blocking pool.
    async fn boot_file(&self, requested: &str) -> Result<(std::path::PathBuf, u64), FileRefusal> {
        if let Some(found) = self.inner.files.recent(requested) {
            return Ok(found);
        }
        let files = self.inner.files.clone();
        let name = requested.to_string();
        tokio::task::spawn_blocking(move || files.resolve_len(&name))
            .await
            .unwrap_or(Err(FileRefusal::Unavailable))
    }

    /// HTTP `/ipxe/{file}`: an iPXE binary for UEFI HTTP boot. A whole `GET` of a file that is
    /// there (not the firmware's `HEAD`, which asks for the length and type first, nor a range)
    /// is the `http.ipxe` step of the boot timeline, attributed to the machine at `peer`.
    pub async fn ipxe_file(
        &self,
        requested: &str,
        peer: IpAddr,
        whole_get: bool,
    ) -> Result<std::path::PathBuf, FileRefusal> {
        let (path, bytes) = self.boot_file(requested).await?;
        if let (true, IpAddr::V4(ip)) = (whole_get, peer) {
            tracing::info!(file = %requested, bytes, from = %ip, "ipxe binary served over HTTP");
            self.inner.timeline.record(Step {
                kind: "http.ipxe",
                mac: None,
                ip: Some(ip),
                machine: None,
                detail: serde_json::json!({"file": requested, "bytes": bytes}),
            });
        }
        Ok(path)
    }

    /// A machine's boot timeline: every DHCP, TFTP and HTTP step and config fetch seen for it,
    /// with the state changes and reinstall stages between them, oldest first.
    pub async fn timeline_of(
        &self,
        id: crate::domain::MachineId,
    ) -> Result<Vec<crate::service::Event>, crate::service::ServiceError> {
        const STEPS: &[&str] = &[
            "dhcp.",
            "tftp.",
            "http.",
            "boot.",
            "config.",
            "reinstall.",
            "machine.state",
            "image.",
        ];
        let all = self
            .inner
            .inventory
            .events(&crate::service::EventFilter {
                machine_id: Some(id),
                kind_prefix: None,
                after_id: None,
                limit: 10_000,
            })
            .await?;
        Ok(all
            .into_iter()
            .filter(|e| STEPS.iter().any(|p| e.kind.starts_with(p)))
            .collect())
    }

    async fn machine_at(
        &self,
        ip: Ipv4Addr,
    ) -> Result<Option<crate::domain::MachineId>, FileRefusal> {
        self.inner.identities.machine_at(ip).await.map_err(|e| {
            tracing::error!(error = %e, %ip, "boot: machine look-up failed");
            FileRefusal::Unavailable
        })
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

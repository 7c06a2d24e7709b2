//! `RedfishBmc`: the `Bmc` trait over a Redfish service, found entirely by following links from
//! the service root (root -> Systems -> the system -> its Manager, Storage, EthernetInterfaces,
//! VirtualMedia).
//!
//! State changes are confirmed, not assumed: power polls `PowerState` to the target under a
//! deadline, the boot override and virtual media are read back after they are written.
//!
//! One file per concern: `discovery` (the system, its manager, the quirk row), `power`, `boot`
//! (the one-time override), `media` (the virtual CD), `inspect` (hardware) and `capabilities`
//! (the probe). This file holds the client and its `Bmc` implementation, which hands each call to
//! the file that owns it.

mod boot;
mod capabilities;
mod discovery;
mod inspect;
mod media;
mod power;

use async_trait::async_trait;
use tokio::sync::OnceCell;

use super::odata::text;
use super::quirks::Quirks;
use super::transport::{AuthMode, BmcEndpoint, BmcOptions, Doc, Transport};
use super::BmcError;
use crate::domain::InspectedHardware;
use crate::service::ports::bmc::{
    Bmc, BootMode, BootOverride, BootTarget, Capabilities, PowerAction, PowerState, ServiceRoot,
    VirtualMediaStatus,
};
use discovery::Discovered;

/// A Redfish BMC.
pub struct RedfishBmc {
    t: Transport,
    found: OnceCell<Discovered>,
}

impl std::fmt::Debug for RedfishBmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishBmc")
            .field("auth", &self.t.auth_mode())
            .field("tls", self.t.tls())
            .finish_non_exhaustive()
    }
}

impl RedfishBmc {
    /// A client for one BMC. No I/O happens until the first call; the session is created then.
    pub fn new(endpoint: BmcEndpoint, options: BmcOptions) -> Result<Self, BmcError> {
        Ok(RedfishBmc {
            t: Transport::new(&endpoint, options)?,
            found: OnceCell::new(),
        })
    }

    /// How the client authenticates right now (`None` before the first request).
    pub fn auth_mode(&self) -> AuthMode {
        self.t.auth_mode()
    }

    /// The Redfish URI of the system this client drives.
    pub async fn system_uri(&self) -> Result<String, BmcError> {
        Ok(self.discover().await?.system.clone())
    }

    /// The quirk row that applies to this BMC.
    pub async fn quirks(&self) -> Result<&'static Quirks, BmcError> {
        Ok(self.discover().await?.quirks)
    }

    async fn discover(&self) -> Result<&Discovered, BmcError> {
        self.found.get_or_try_init(|| self.discover_now()).await
    }

    async fn system(&self) -> Result<Doc, BmcError> {
        let d = self.discover().await?;
        self.t.get(&d.system).await
    }
}

#[async_trait]
impl Bmc for RedfishBmc {
    async fn power_state(&self) -> Result<PowerState, BmcError> {
        power::power_of(&self.system().await?)
    }

    async fn power(&self, action: PowerAction) -> Result<PowerState, BmcError> {
        self.power_now(action).await
    }

    async fn boot_once(
        &self,
        target: BootTarget,
        mode: Option<BootMode>,
    ) -> Result<BootOverride, BmcError> {
        self.set_boot_once(target, mode).await
    }

    async fn media_insert(&self, image_url: &str) -> Result<VirtualMediaStatus, BmcError> {
        self.insert_media(image_url).await
    }

    async fn media_eject(&self) -> Result<VirtualMediaStatus, BmcError> {
        self.eject_media().await
    }

    async fn media_status(&self) -> Result<VirtualMediaStatus, BmcError> {
        self.cd_status().await
    }

    async fn inspect(&self) -> Result<InspectedHardware, BmcError> {
        self.inspect_now().await
    }

    async fn capabilities(&self) -> Result<Capabilities, BmcError> {
        self.probe_capabilities().await
    }

    async fn close(&self) -> Result<(), BmcError> {
        self.t.close().await
    }

    async fn service_root(&self) -> Result<ServiceRoot, BmcError> {
        let root = self
            .t
            .get_anonymous(crate::bmc::transport::SERVICE_ROOT)
            .await?;
        Ok(ServiceRoot {
            redfish_version: text(&root, "RedfishVersion"),
            vendor: text(&root, "Vendor"),
            product: text(&root, "Product"),
        })
    }
}

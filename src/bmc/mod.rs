//! The Redfish client: power, one-time boot override, virtual media, out-of-band inspection and
//! capability probing of a machine's BMC, over `reqwest` with rustls.
//!
//! Layout: the `Bmc` trait, its result types and `BmcError` are the BMC port,
//! `crate::service::ports::bmc` (the service layer owns the traits it needs), and the inspected
//! hardware types are domain data (`crate::domain::inspection`); both are re-exported here;
//! `transport/` owns HTTP, one file per concern (`endpoint`, `request` with retries, timeouts and
//! the per-BMC request limit, `session`, `etag`, `task`); `tls` builds the rustls configuration
//! (system roots, a pinned certificate fingerprint, or explicitly insecure); `odata` reads Redfish
//! JSON (links, collection pages, properties); `quirks` is the one table of vendor differences;
//! `redfish/` implements `Bmc` on top of them, one file per concern (`discovery`, `power`, `boot`,
//! `media`, `inspect`, `capabilities`).
//!
//! Every resource is found by following links from the service root; no path but `/redfish/v1/` is
//! ever built by hand. This module may import `domain` (MAC addresses, disk types, TLS modes,
//! inspected hardware) and the BMC port (`service::ports`), nothing from the use cases, `store`,
//! `http` or the front doors. Passwords and session tokens are never logged,
//! never sent to another origin than the configured one (links resolve on it, redirects are not
//! followed), and never sent to an `http://` BMC unless its TLS mode is `insecure-http`.

mod odata;
mod quirks;
mod redfish;
mod tls;
mod transport;

pub use crate::domain::{
    disk_type_of, DriveSource, InspectedDrive, InspectedHardware, InspectedNic,
};
pub use crate::service::ports::bmc::{
    Bmc, BmcError, BootMode, BootOverride, BootTarget, Capabilities, EtagSupport, MediaLocation,
    PowerAction, PowerState, VirtualMediaStatus,
};
pub use quirks::{quirks_for, ModeInPatch, Quirks, QUIRKS};
pub use redfish::RedfishBmc;
pub use tls::{CertFingerprint, TlsPolicy};
pub use transport::{AuthMode, BmcEndpoint, BmcOptions, Password};

/// Builds a [`RedfishBmc`] for each BMC record the service layer hands over.
#[derive(Clone, Debug, Default)]
pub struct RedfishConnector {
    /// Timeouts, retries and limits of every client it builds.
    pub options: BmcOptions,
}

impl crate::service::ports::BmcConnector for RedfishConnector {
    fn connect(
        &self,
        bmc: &crate::domain::Bmc,
        password: &str,
    ) -> Result<std::sync::Arc<dyn Bmc>, BmcError> {
        let endpoint = BmcEndpoint::from_inventory(bmc, Password::new(password))?;
        Ok(std::sync::Arc::new(RedfishBmc::new(
            endpoint,
            self.options.clone(),
        )?))
    }
}

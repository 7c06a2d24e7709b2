//! The capability probe: what this BMC offers (vendor, model, quirk row, Redfish version, sessions
//! and how the client authenticates, reset types, boot targets, whether the boot mode can be set,
//! where its virtual CD is, its ETag behaviour, the TLS verification in use).

use super::boot;
use super::RedfishBmc;
use crate::bmc::odata::{text, text_at};
use crate::bmc::transport::AuthMode;
use crate::bmc::BmcError;
use crate::service::ports::bmc::{Capabilities, EtagSupport};

impl RedfishBmc {
    /// Probe what the BMC supports.
    pub(super) async fn probe_capabilities(&self) -> Result<Capabilities, BmcError> {
        let d = self.discover().await?;
        let sys = self.system().await?;
        let reset_types = self.reset_types(&sys.json).await?;
        let boot_targets = boot::boot_targets(&sys.json);
        let virtual_media = match self.cd_slot().await {
            Ok((_, loc)) => Some(loc),
            Err(BmcError::NotSupported(_)) => None,
            Err(e) => return Err(e),
        };
        let etag = sys.etag.clone();
        Ok(Capabilities {
            vendor: d.vendor.clone(),
            model: d.model.clone(),
            quirks: (d.quirks.name != "generic").then(|| d.quirks.name.to_string()),
            redfish_version: text(&d.root, "RedfishVersion"),
            sessions: text_at(&d.root, "/Links/Sessions/@odata.id").is_some()
                || self.t.sessions_linked(),
            auth: match self.t.auth_mode() {
                AuthMode::Session => "session".into(),
                AuthMode::Basic => "basic".into(),
                AuthMode::None => "none".into(),
            },
            reset_types,
            boot_targets,
            // The same reading boot-once acts on: absent, null or blank is not settable.
            boot_mode_settable: boot::boot_override(&sys.json).mode.is_some(),
            virtual_media,
            etag: EtagSupport {
                offered: etag.is_some(),
                weak: etag.as_deref().is_some_and(|e| e.starts_with("W/")),
                if_match_required: self.t.if_match_required(),
            },
            tls: self.t.tls().mode(),
        })
    }
}

//! The operator's view of a machine's config: does it render and validate now, with what digest,
//! warnings and install disk, and the provisioning window and what was last served. Never the
//! config itself (it carries cluster secrets).

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::ConfigService;
use crate::domain::Machine;
use crate::service::ports::ProvisionWindow;
use crate::service::{MachineConfigError, ServiceError};

/// The operator's view of a machine's config.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConfigStatus {
    /// Whether the config renders and validates now.
    pub valid: bool,
    /// Why not.
    pub error: Option<String>,
    /// SHA-256 of the config it would serve now.
    pub sha256: Option<String>,
    /// Target Talos version.
    pub talos_version: Option<String>,
    /// Image Factory schematic.
    pub schematic_id: Option<String>,
    /// The install disk and how it is pinned.
    pub install_disk: Option<String>,
    /// Warnings.
    pub warnings: Vec<String>,
    /// The provisioning window.
    pub window: Option<ProvisionWindow>,
    /// Whether the window is open now.
    pub window_open: bool,
    /// SHA-256 of the config last served.
    pub served_sha256: Option<String>,
    /// When it was served.
    pub served_at: Option<DateTime<Utc>>,
    /// Why the config is held, when its release waits for an operator (`awaiting approval`).
    pub hold: Option<String>,
}

impl ConfigService {
    /// The status of `m`'s config. A config that does not render is a status (`valid: false`
    /// and why); a store fault is an error.
    pub async fn status(&self, m: &Machine) -> Result<ConfigStatus, ServiceError> {
        let rendered = match self.render_machine(m).await {
            Err(MachineConfigError::Store(e)) => return Err(ServiceError::from(e)),
            other => other,
        };
        let window = self.window(m.id).await.map_err(ServiceError::from)?;
        let open = window.as_ref().is_some_and(|w| w.is_open(Utc::now()));
        let hold = self.hold_in(m, open).await?;
        let served = self.served(m.id).await.map_err(ServiceError::from)?;
        let now = Utc::now();
        let (valid, error, r) = match rendered {
            Ok(r) => (true, None, Some(r)),
            Err(e) => (false, Some(e.to_string()), None),
        };
        Ok(ConfigStatus {
            valid,
            error,
            sha256: r.as_ref().map(|r| r.sha256.clone()),
            talos_version: r.as_ref().map(|r| r.version.to_string()),
            schematic_id: r.as_ref().map(|r| r.schematic_id.clone()),
            install_disk: r.as_ref().and_then(|r| r.install_disk.clone()),
            warnings: r.map(|r| r.warnings).unwrap_or_default(),
            window_open: window.as_ref().is_some_and(|w| w.is_open(now)),
            window,
            served_sha256: served.as_ref().map(|s| s.sha256.clone()),
            served_at: served.map(|s| s.at),
            hold,
        })
    }

    /// Why `m`'s config is held for an operator now (its release awaits approval while its
    /// window is open), without rendering it: cheap enough for every machine of a list.
    pub async fn hold(&self, m: &Machine) -> Result<Option<String>, ServiceError> {
        let window = self.window(m.id).await.map_err(ServiceError::from)?;
        let open = window.as_ref().is_some_and(|w| w.is_open(Utc::now()));
        self.hold_in(m, open).await
    }

    async fn hold_in(
        &self,
        m: &Machine,
        window_open: bool,
    ) -> Result<Option<String>, ServiceError> {
        Ok((window_open && self.awaiting_approval(m).await?)
            .then(|| super::window::AWAITING_APPROVAL.to_string()))
    }

    /// Name, Talos version and schematic of every declared cluster, by name (its secrets and
    /// patches stay sealed).
    pub async fn cluster_images(&self) -> Result<Vec<(String, String, String)>, ServiceError> {
        let mut out: Vec<(String, String, String)> = self
            .configs
            .clusters()
            .await?
            .into_iter()
            .map(|c| (c.spec.name, c.spec.talos_version, c.spec.schematic_id))
            .collect();
        out.sort();
        Ok(out)
    }
}

//! The BMC use cases that act on a machine or read its state: power, the one-time boot override
//! and the virtual CD. Each action is recorded as an event (actor, action, result, elapsed time;
//! never the password) and a log line, whether it succeeded or not.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{machine_ref, BmcService};
use crate::domain::{self, Machine, MachineRef};
use crate::service::error::ServiceError;
use crate::service::ports::bmc::{
    BmcError, BootMode, BootOverride, BootTarget, PowerAction, VirtualMediaStatus,
};
use crate::service::ports::NewEvent;

/// A power state as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PowerReport {
    /// The machine.
    pub machine: MachineRef,
    /// The operation run, absent for a status read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<PowerAction>,
    /// `on`, `off`, `powering-on`, `powering-off`, `paused`, or the BMC's own word.
    pub power_state: String,
    /// How long the operation took, confirmation included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
}

/// The boot override a BMC holds after a one-time boot request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BootOnceReport {
    /// The machine.
    pub machine: MachineRef,
    /// What was asked.
    pub target: BootTarget,
    /// The firmware mode asked for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<BootMode>,
    /// What the BMC holds, read back after the change.
    pub boot_override: BootOverride,
}

/// The virtual CD/DVD slot of a machine's BMC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MediaReport {
    /// The machine.
    pub machine: MachineRef,
    /// The slot, read back from the BMC.
    pub media: VirtualMediaStatus,
}

impl BmcService {
    /// Append an event; a failure is logged, since the BMC action it describes already happened.
    pub(super) async fn event(&self, m: &Machine, kind: &str, actor: &str, detail: Value) {
        let ev = NewEvent {
            machine_id: Some(m.id),
            kind: kind.into(),
            actor: actor.into(),
            detail,
        };
        if let Err(e) = self.inner.inventory.append_event(&ev).await {
            tracing::error!(machine = %m.id, name = %m.display_name(), kind, error = %e, "cannot record BMC event");
        }
    }

    /// Record an action's outcome as an event and a log line, then hand the outcome back.
    pub(super) async fn finish<T>(
        &self,
        m: &Machine,
        kind: &str,
        actor: &str,
        mut detail: Map<String, Value>,
        started: Instant,
        result: Result<T, BmcError>,
    ) -> Result<T, ServiceError> {
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        detail.insert("elapsed_ms".into(), json!(elapsed_ms));
        match &result {
            Ok(_) => {
                detail.insert("result".into(), json!("ok"));
                tracing::info!(machine = %m.id, name = %m.display_name(), action = kind, actor, elapsed_ms, "BMC action done");
            }
            Err(e) => {
                detail.insert("result".into(), json!("failed"));
                detail.insert("error".into(), json!(e.to_string()));
                if let BmcError::BootNotApplied { wanted, actual } = e {
                    detail.insert("wanted".into(), json!(wanted));
                    detail.insert("actual".into(), json!(actual));
                }
                tracing::warn!(machine = %m.id, name = %m.display_name(), action = kind, actor, elapsed_ms, error = %e, "BMC action failed");
            }
        }
        self.event(m, kind, actor, Value::Object(detail)).await;
        result.map_err(ServiceError::Bmc)
    }

    /// The current power state.
    pub async fn power_state(&self, reference: &str) -> Result<PowerReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let state = bmc.power_state().await.map_err(ServiceError::Bmc)?;
        Ok(PowerReport {
            machine: machine_ref(&m),
            action: None,
            power_state: state.to_string(),
            elapsed_ms: None,
        })
    }

    /// Run a power operation and wait until the BMC reports the state it implies.
    pub async fn power(
        &self,
        reference: &str,
        action: PowerAction,
        actor: &str,
    ) -> Result<PowerReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let started = Instant::now();
        let result = bmc.power(action).await;
        let mut detail = Map::new();
        detail.insert("action".into(), json!(action));
        if let Ok(state) = &result {
            detail.insert("power_state".into(), json!(state.to_string()));
        }
        let state = self
            .finish(&m, "bmc.power", actor, detail, started, result)
            .await?;
        Ok(PowerReport {
            machine: machine_ref(&m),
            action: Some(action),
            power_state: state.to_string(),
            elapsed_ms: u64::try_from(started.elapsed().as_millis()).ok(),
        })
    }

    /// Set a one-time boot override and confirm the BMC kept it.
    pub async fn boot_once(
        &self,
        reference: &str,
        target: BootTarget,
        mode: Option<BootMode>,
        actor: &str,
    ) -> Result<BootOnceReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let started = Instant::now();
        let result = bmc.boot_once(target, mode).await;
        let mut detail = Map::new();
        detail.insert("target".into(), json!(target));
        detail.insert("mode".into(), json!(mode));
        if let Ok(o) = &result {
            detail.insert("boot_override".into(), json!(o));
        }
        let boot_override = self
            .finish(&m, "bmc.boot_once", actor, detail, started, result)
            .await?;
        Ok(BootOnceReport {
            machine: machine_ref(&m),
            target,
            mode,
            boot_override,
        })
    }

    /// The virtual CD/DVD slot.
    pub async fn media_status(&self, reference: &str) -> Result<MediaReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let media = bmc.media_status().await.map_err(ServiceError::Bmc)?;
        Ok(MediaReport {
            machine: machine_ref(&m),
            media,
        })
    }

    /// Insert an image (an http or https URL the BMC can fetch) into the virtual CD/DVD slot.
    pub async fn media_insert(
        &self,
        reference: &str,
        image: &str,
        actor: &str,
    ) -> Result<MediaReport, ServiceError> {
        let image = image.trim();
        let valid = (image.starts_with("http://") || image.starts_with("https://"))
            && image.len() <= 2048
            && !image.chars().any(|c| c.is_whitespace() || c.is_control());
        if !valid {
            let mut e = domain::ValidationErrors::default();
            e.push(
                "image",
                "must be an http:// or https:// URL the BMC can download (at most 2048 characters)",
            );
            return Err(ServiceError::Invalid(e));
        }
        let (m, bmc) = self.client(reference).await?;
        let started = Instant::now();
        let result = bmc.media_insert(image).await;
        let mut detail = Map::new();
        detail.insert("image".into(), json!(image));
        if let Ok(s) = &result {
            detail.insert("slot".into(), json!(s.slot));
        }
        let media = self
            .finish(&m, "bmc.media.insert", actor, detail, started, result)
            .await?;
        Ok(MediaReport {
            machine: machine_ref(&m),
            media,
        })
    }

    /// Eject the virtual CD/DVD slot.
    pub async fn media_eject(
        &self,
        reference: &str,
        actor: &str,
    ) -> Result<MediaReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let started = Instant::now();
        let result = bmc.media_eject().await;
        let mut detail = Map::new();
        if let Ok(s) = &result {
            detail.insert("slot".into(), json!(s.slot));
        }
        let media = self
            .finish(&m, "bmc.media.eject", actor, detail, started, result)
            .await?;
        Ok(MediaReport {
            machine: machine_ref(&m),
            media,
        })
    }
}

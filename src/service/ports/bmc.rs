//! The BMC port: what the rest of Plinth sees of a BMC. The `Bmc` trait (implemented over Redfish
//! by `crate::bmc`), `BmcConnector` (builds a `Bmc` for a BMC record), their error type and the
//! plain result types they return (power state, boot override, virtual media, capabilities), and
//! `BmcCapabilityStore` (where probed capabilities are kept, implemented by `crate::store`). The
//! inspected hardware types `Bmc::inspect` returns are domain data (`domain::inspection`).
//!
//! Nothing here knows about HTTP, JSON or Redfish paths, so the service layer can depend on these
//! types and tests can implement the trait without a network. Imports `domain` and the other
//! ports only.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::events::NewEvent;
use crate::domain::{self, InspectedHardware, MachineId, TlsMode};

/// Errors of the Redfish client. Messages name the request and what the BMC answered; they never
/// carry a password or a session token.
#[derive(Debug, thiserror::Error)]
pub enum BmcError {
    /// The endpoint or options are unusable (bad URL, bad fingerprint, no trust roots).
    #[error("BMC configuration: {0}")]
    Config(String),
    /// The BMC could not be reached, or the connection broke, after the allowed retries.
    #[error("{method} {path}: cannot talk to the BMC: {reason}")]
    Transport {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The transport error, with its causes.
        reason: String,
    },
    /// No answer within the per-request timeout.
    #[error("{method} {path}: no answer within {after:?}")]
    Timeout {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The timeout that expired.
        after: Duration,
    },
    /// The BMC answered with a non-success status.
    #[error("{method} {path}: HTTP {status}: {message}")]
    Http {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// Status code.
        status: u16,
        /// Redfish error message, or the start of a non-JSON body.
        message: String,
    },
    /// The BMC refused the credentials.
    #[error("the BMC refused the credentials: {0}")]
    Unauthorized(String),
    /// An answer that does not have the shape Redfish promises.
    #[error("unexpected answer from {path}: {reason}")]
    Protocol {
        /// Resource path.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// The BMC does not offer what was asked.
    #[error("not supported by this BMC: {0}")]
    NotSupported(String),
    /// A state change did not complete in time.
    #[error("{what} did not complete within {after:?}; last seen: {last}")]
    Deadline {
        /// What was awaited.
        what: String,
        /// The deadline.
        after: Duration,
        /// The last state observed.
        last: String,
    },
    /// The BMC accepted a boot override but holds something else when read back.
    #[error("boot override not kept: asked for {wanted}; the BMC holds {actual}")]
    BootNotApplied {
        /// What was written.
        wanted: Box<BootOverride>,
        /// What was read back.
        actual: Box<BootOverride>,
    },
    /// Virtual media did not end up as asked.
    #[error("virtual media at {slot}: {reason}")]
    MediaNotApplied {
        /// Slot URI.
        slot: String,
        /// What the BMC did instead.
        reason: String,
    },
    /// A task monitor reported failure.
    #[error("task {task} ended {state}: {message}")]
    TaskFailed {
        /// Task monitor URI.
        task: String,
        /// `TaskState`, e.g. `Exception`.
        state: String,
        /// The task's messages.
        message: String,
    },
}

/// Power state of a computer system, as the BMC reports it (Redfish `PowerState`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PowerState {
    /// Powered on.
    On,
    /// Powered off.
    Off,
    /// Transitioning to on.
    PoweringOn,
    /// Transitioning to off.
    PoweringOff,
    /// Paused (some BMCs, and virtual machines behind an emulator).
    Paused,
    /// A value this client does not know, kept as the BMC spelled it.
    Other(String),
}

impl PowerState {
    /// Parse the Redfish spelling; unknown values are kept as text.
    pub fn from_redfish(s: &str) -> Self {
        match s {
            "On" => PowerState::On,
            "Off" => PowerState::Off,
            "PoweringOn" => PowerState::PoweringOn,
            "PoweringOff" => PowerState::PoweringOff,
            "Paused" => PowerState::Paused,
            other => PowerState::Other(other.to_string()),
        }
    }
}

impl fmt::Display for PowerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PowerState::On => "on",
            PowerState::Off => "off",
            PowerState::PoweringOn => "powering-on",
            PowerState::PoweringOff => "powering-off",
            PowerState::Paused => "paused",
            PowerState::Other(s) => s,
        })
    }
}

/// A power operation requested by an operator (`plinth bmc power MACHINE ...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PowerAction {
    /// Power on; done when `PowerState` is `On`.
    On,
    /// Power off at once (Redfish `ForceOff`); done when `PowerState` is `Off`.
    Off,
    /// Hard power cycle: `PowerCycle` where allowed, else off, wait for Off, on.
    Cycle,
    /// Ask the operating system to restart (`GracefulRestart`).
    GracefulRestart,
}

impl FromStr for PowerAction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "on" => Ok(PowerAction::On),
            "off" => Ok(PowerAction::Off),
            "cycle" => Ok(PowerAction::Cycle),
            "graceful-restart" => Ok(PowerAction::GracefulRestart),
            other => Err(format!(
                "`{other}` is not one of: on, off, cycle, graceful-restart"
            )),
        }
    }
}

impl fmt::Display for PowerAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PowerAction::On => "on",
            PowerAction::Off => "off",
            PowerAction::Cycle => "cycle",
            PowerAction::GracefulRestart => "graceful-restart",
        })
    }
}

/// Device of a one-time boot override.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BootTarget {
    /// Network boot through PXE (Redfish `Pxe`).
    Pxe,
    /// UEFI HTTP boot (Redfish `UefiHttp`).
    Http,
    /// The (virtual) CD/DVD drive (Redfish `Cd`; some vendors name it otherwise, see quirks).
    Cd,
}

impl FromStr for BootTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "pxe" => Ok(BootTarget::Pxe),
            "http" => Ok(BootTarget::Http),
            "cd" => Ok(BootTarget::Cd),
            other => Err(format!("`{other}` is not one of: pxe, http, cd")),
        }
    }
}

impl fmt::Display for BootTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BootTarget::Pxe => "pxe",
            BootTarget::Http => "http",
            BootTarget::Cd => "cd",
        })
    }
}

/// Firmware mode of a boot override.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BootMode {
    /// UEFI boot (Redfish `UEFI`).
    Uefi,
    /// Legacy BIOS boot (Redfish `Legacy`).
    Legacy,
}

impl BootMode {
    /// The Redfish spelling.
    pub fn redfish(&self) -> &'static str {
        match self {
            BootMode::Uefi => "UEFI",
            BootMode::Legacy => "Legacy",
        }
    }
}

impl FromStr for BootMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "uefi" => Ok(BootMode::Uefi),
            "legacy" | "bios" => Ok(BootMode::Legacy),
            other => Err(format!("`{other}` is not one of: uefi, legacy")),
        }
    }
}

impl fmt::Display for BootMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BootMode::Uefi => "uefi",
            BootMode::Legacy => "legacy",
        })
    }
}

/// The boot override a BMC holds, as read back from it (Redfish spellings kept as text).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BootOverride {
    /// `BootSourceOverrideTarget`, e.g. `Pxe`.
    pub target: Option<String>,
    /// `BootSourceOverrideEnabled`: `Once`, `Continuous` or `Disabled`.
    pub enabled: Option<String>,
    /// `BootSourceOverrideMode`: `UEFI` or `Legacy`; `None` when the BMC does not expose it.
    pub mode: Option<String>,
}

impl fmt::Display for BootOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".into());
        write!(
            f,
            "target {}, enabled {}, mode {}",
            s(&self.target),
            s(&self.enabled),
            s(&self.mode)
        )
    }
}

/// The virtual CD/DVD slot of a BMC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VirtualMediaStatus {
    /// Redfish URI of the slot (where the BMC put it: under the Manager or the System).
    pub slot: String,
    /// Whether the slot hangs under the Manager or the System.
    pub location: MediaLocation,
    /// Whether media is inserted.
    pub inserted: bool,
    /// URL of the inserted image, if any.
    pub image: Option<String>,
    /// `ConnectedVia`, e.g. `URI` or `NotConnected`.
    pub connected_via: Option<String>,
    /// Media types the slot accepts, e.g. `CD`, `DVD`.
    pub media_types: Vec<String>,
}

/// Where a BMC links its virtual media.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum MediaLocation {
    /// `Systems/<id>/VirtualMedia` (the ComputerSystem links it).
    System,
    /// `Managers/<id>/VirtualMedia`.
    Manager,
}

/// What a BMC can do, probed once at registration and refreshed on demand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Capabilities {
    /// Vendor as the service root or the system names it, e.g. `Dell`, `HPE`, `Supermicro`.
    pub vendor: Option<String>,
    /// System model, e.g. `PowerEdge R750`.
    pub model: Option<String>,
    /// The row of the quirk table that applies, e.g. `dell-idrac`; `None` for a generic BMC.
    pub quirks: Option<String>,
    /// `RedfishVersion` of the service root.
    pub redfish_version: Option<String>,
    /// Whether the BMC links a session collection (`Links.Sessions`).
    pub sessions: bool,
    /// How this client authenticates now: `session` or `basic`.
    pub auth: String,
    /// Allowed `ResetType` values (from the action or its `@Redfish.ActionInfo`).
    pub reset_types: Vec<String>,
    /// Allowed `BootSourceOverrideTarget` values.
    pub boot_targets: Vec<String>,
    /// Whether the BMC exposes `BootSourceOverrideMode` (UEFI/Legacy) on the override.
    pub boot_mode_settable: bool,
    /// Where the virtual CD/DVD slot is, `None` without virtual media.
    pub virtual_media: Option<MediaLocation>,
    /// ETags on the ComputerSystem: offered, weak, and whether PATCH requires `If-Match`.
    pub etag: EtagSupport,
    /// TLS verification used for this BMC.
    pub tls: TlsMode,
}

/// ETag behaviour of a BMC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EtagSupport {
    /// The ComputerSystem carries an ETag (header or `@odata.etag`).
    pub offered: bool,
    /// The ETag is weak (`W/"..."`).
    pub weak: bool,
    /// PATCH needs `If-Match` (known from the quirk table or learned from a 428).
    pub if_match_required: bool,
}

/// A BMC as the service layer drives it. Implemented by `crate::bmc::RedfishBmc`.
///
/// Every method that changes state also confirms it: power operations poll `PowerState` to the
/// target under a deadline, the boot override is read back after it is written, and virtual media
/// is read back after insert/eject.
#[async_trait]
pub trait Bmc: Send + Sync {
    /// Current power state.
    async fn power_state(&self) -> Result<PowerState, BmcError>;
    /// Run a power operation and wait until the system reaches the state it implies.
    async fn power(&self, action: PowerAction) -> Result<PowerState, BmcError>;
    /// Set a one-time boot override and confirm the BMC kept target, enablement and mode.
    async fn boot_once(
        &self,
        target: BootTarget,
        mode: Option<BootMode>,
    ) -> Result<BootOverride, BmcError>;
    /// Insert an image URL into the virtual CD/DVD slot (ejecting what is there first).
    async fn media_insert(&self, image_url: &str) -> Result<VirtualMediaStatus, BmcError>;
    /// Eject the virtual CD/DVD slot.
    async fn media_eject(&self) -> Result<VirtualMediaStatus, BmcError>;
    /// State of the virtual CD/DVD slot.
    async fn media_status(&self) -> Result<VirtualMediaStatus, BmcError>;
    /// Out-of-band hardware inventory.
    async fn inspect(&self) -> Result<InspectedHardware, BmcError>;
    /// Probe what the BMC supports.
    async fn capabilities(&self) -> Result<Capabilities, BmcError>;
    /// Log out (DELETE the session) and release the connection.
    async fn close(&self) -> Result<(), BmcError>;
    /// The service root, read without credentials (Redfish serves it to anyone, DSP0266 §13.3.1):
    /// whether the BMC answers over its TLS mode at all, before any password is sent.
    async fn service_root(&self) -> Result<ServiceRoot, BmcError>;
}

/// What a BMC's service root says about it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ServiceRoot {
    /// `RedfishVersion`.
    pub redfish_version: Option<String>,
    /// `Vendor`.
    pub vendor: Option<String>,
    /// `Product`.
    pub product: Option<String>,
}

/// Builds a client for one BMC from its inventory record and decrypted password.
pub trait BmcConnector: Send + Sync + 'static {
    /// A client for `bmc`. No I/O should happen before the first call on it.
    fn connect(&self, bmc: &domain::Bmc, password: &str) -> Result<Arc<dyn Bmc>, BmcError>;
}

/// What a BMC can do, as last probed, and how the last probe went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CapabilityRecord {
    /// The machine whose BMC this is.
    pub machine_id: MachineId,
    /// The BMC URL the probe talked to.
    pub bmc_url: String,
    /// What the last successful probe found; absent when no probe has succeeded yet.
    pub capabilities: Option<Capabilities>,
    /// When the capabilities were probed.
    pub probed_at: Option<DateTime<Utc>>,
    /// Why the last attempt failed; absent when it succeeded.
    pub last_error: Option<String>,
    /// When the last attempt (successful or not) ran.
    pub attempted_at: DateTime<Utc>,
    /// The machine's BMC URL changed since: probe again.
    #[serde(default)]
    pub stale: bool,
}

/// Where capability records are kept.
#[async_trait]
pub trait BmcCapabilityStore: Send + Sync + 'static {
    /// Insert or replace the record of a machine's BMC, with its event, in one transaction.
    async fn put_bmc_capabilities(
        &self,
        rec: &CapabilityRecord,
        event: &NewEvent,
    ) -> Result<(), StoreError>;

    /// The record of a machine's BMC, if one was ever probed.
    async fn bmc_capabilities(&self, id: MachineId)
        -> Result<Option<CapabilityRecord>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_words() {
        assert_eq!("Graceful-Restart".parse(), Ok(PowerAction::GracefulRestart));
        assert_eq!("HTTP".parse(), Ok(BootTarget::Http));
        assert_eq!("uefi".parse(), Ok(BootMode::Uefi));
        assert!("floppy".parse::<BootTarget>().is_err());
        assert_eq!(
            PowerState::from_redfish("Resetting"),
            PowerState::Other("Resetting".into())
        );
    }
}

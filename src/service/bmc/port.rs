//! The traits the BMC use cases need from outside: `Bmc` (a BMC as the service drives it,
//! implemented over Redfish by `crate::bmc`), `BmcConnector` (builds a `Bmc` for a BMC record) and
//! `BmcCapabilityStore` (where capability records are kept, implemented by `crate::store`).
//! Imports the BMC model types, `domain` and the store's event and error types; nothing concrete.

use std::sync::Arc;

use async_trait::async_trait;

use super::model::{
    BmcError, BootMode, BootOverride, BootTarget, Capabilities, PowerAction, PowerState,
    VirtualMediaStatus,
};
use super::probe::CapabilityRecord;
use crate::domain::{self, InspectedHardware, MachineId};
use crate::service::store::{NewEvent, StoreError};

/// Builds a client for one BMC from its inventory record and decrypted password.
pub trait BmcConnector: Send + Sync + 'static {
    /// A client for `bmc`. No I/O should happen before the first call on it.
    fn connect(&self, bmc: &domain::Bmc, password: &str) -> Result<Arc<dyn Bmc>, BmcError>;
}

/// Where capability records are kept.
#[async_trait]
pub trait BmcCapabilityStore: Send + Sync {
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

/// A BMC as the service layer drives it. Implemented by [`super::RedfishBmc`].
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
}

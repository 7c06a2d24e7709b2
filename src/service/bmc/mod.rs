//! The BMC use cases: power, one-time boot override, virtual media, out-of-band inspection and
//! capability probing of a machine's BMC, each recorded as an event (actor, action, result; never
//! the password).
//!
//! One file per concept: `actions` (power, boot override, virtual media, and how each is recorded),
//! `clients` (the cache of one client per machine, rebuilt only when the URL, user, TLS settings or
//! password change: a client's session and its per-BMC limit of concurrent requests only work when
//! it is reused), `probe` (capability records), `inspection` (out-of-band inspection merged into
//! the inventory as one versioned change; the merge rule itself is `domain::inspection`), `model`
//! (the error and result types) and `port` (the traits the use cases need from outside: `Bmc`,
//! implemented over Redfish by `crate::bmc`; `BmcConnector`, which builds a `Bmc` for a BMC
//! record; `BmcCapabilityStore`, implemented by `crate::store`). This file holds `BmcService`.
//!
//! This module imports `domain` and the rest of `service`, nothing from `bmc`, `store` or `http`.

mod actions;
mod clients;
mod inspection;
pub mod model;
mod port;
mod probe;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::store::InventoryStore;
use super::Inventory;
use crate::domain::{Machine, MachineId, MachineRef};
use clients::Cached;

pub use crate::domain::inspection::{
    disk_type_of, merge_inspection, DriveSource, FieldChange, InspectConflict, InspectedDrive,
    InspectedHardware, InspectedNic, Merge,
};
pub use actions::{BootOnceReport, MediaReport, PowerReport};
pub use inspection::InspectionReport;
pub use model::{
    BmcError, BootMode, BootOverride, BootTarget, Capabilities, EtagSupport, MediaLocation,
    PowerAction, PowerState, VirtualMediaStatus,
};
pub use port::{Bmc, BmcCapabilityStore, BmcConnector};
pub use probe::CapabilityRecord;

struct Inner {
    inventory: Inventory,
    caps: Arc<dyn BmcCapabilityStore>,
    connector: Arc<dyn BmcConnector>,
    clients: Mutex<HashMap<MachineId, Cached>>,
}

/// The BMC use cases.
#[derive(Clone)]
pub struct BmcService {
    inner: Arc<Inner>,
}

fn machine_ref(m: &Machine) -> MachineRef {
    MachineRef {
        id: m.id,
        name: m.display_name(),
    }
}

impl BmcService {
    /// The service over the inventory, a capability store and a way to reach BMCs.
    pub fn new(
        inventory: Inventory,
        caps: Arc<dyn BmcCapabilityStore>,
        connector: Arc<dyn BmcConnector>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                inventory,
                caps,
                connector,
                clients: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn store(&self) -> &Arc<dyn InventoryStore> {
        self.inner.inventory.store()
    }
}

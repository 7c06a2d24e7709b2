//! The BMC use cases: power, one-time boot override, virtual media, out-of-band inspection and
//! capability probing of a machine's BMC, each recorded as an event (actor, action, result; never
//! the password).
//!
//! One file per concept: `actions` (power, boot override, virtual media, and how each is recorded),
//! `clients` (the cache of one client per machine, rebuilt only when the URL, user, TLS settings or
//! password change: a client's session and its per-BMC limit of concurrent requests only work when
//! it is reused), `probe` (capability records), `inspection` (out-of-band inspection merged into
//! the inventory as one versioned change; the merge rule itself is `domain::inspection`). This file
//! holds `BmcService`.
//!
//! The traits it needs from outside are the BMC port (`service::ports::bmc`: `Bmc`, implemented
//! over Redfish by `crate::bmc`; `BmcConnector`, which builds a `Bmc` for a BMC record;
//! `BmcCapabilityStore`, implemented by `crate::store`), with the port's error and result types;
//! they are re-exported here by name for the front doors, beside the inspection types of
//! `domain::inspection`. This module imports `domain`, the ports and the inventory use case,
//! nothing from `bmc`, `store` or `http`.

mod actions;
mod clients;
mod inspection;
mod probe;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::inventory::Inventory;
use crate::domain::{Machine, MachineId, MachineRef};
use clients::Cached;

pub use super::ports::bmc::{
    Bmc, BmcCapabilityStore, BmcConnector, BmcError, BootMode, BootOverride, BootTarget,
    Capabilities, CapabilityRecord, EtagSupport, MediaLocation, PowerAction, PowerState,
    VirtualMediaStatus,
};
pub use crate::domain::inspection::{
    disk_type_of, merge_inspection, DriveSource, FieldChange, InspectConflict, InspectedDrive,
    InspectedHardware, InspectedNic, Merge,
};
pub use actions::{BootOnceReport, MediaReport, PowerReport};
pub use inspection::InspectionReport;

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
}

//! The ports of the service layer: one trait per role the use cases need from outside, each in
//! its own file with the records it carries. Stores (`crate::store`) implement the store ports,
//! the Redfish client (`crate::bmc`) implements the BMC port, the image cache (`crate::images`)
//! the image port, the gRPC client (`crate::talos_api`) the Talos API port. Use cases take the
//! ports they use
//! as `Arc<dyn Port>` in their constructors; `Stores` bundles one handle per store port for the
//! wiring in `app`.
//!
//! Imports `domain` (and `talos::disk` for a profile's disk rules) only: nothing from the use
//! cases, `store`, `bmc`, `http` or the front doors.

pub mod bmc;
pub mod configs;
pub mod error;
pub mod events;
pub mod health;
pub mod images;
pub mod leases;
pub mod machines;
pub mod reinstalls;
pub mod snapshots;
pub mod talos_api;
pub mod talos_state;
pub mod tokens;
pub mod upgrades;

use std::sync::Arc;

pub use bmc::{BmcCapabilityStore, BmcConnector, CapabilityRecord};
pub use configs::{
    Approval, ClusterRecord, ClusterSpec, ConfigStore, ConfigWrite, GroupKind, GroupSpec,
    MachinePatches, PatchSource, ProfileSpec, ProvisionWindow, RolePatches, ServedConfig,
};
pub use error::StoreError;
pub use events::{Event, EventFilter, EventStore, NewEvent};
pub use health::{CommitObserver, CommitReport, MigrationGap, StoreHealth};
pub use images::{CachedImage, FetchProgress, ImageFetchError, TalosImages};
pub use leases::{CircuitPin, ClientFacts, Lease, LeaseClaim, LeaseState, LeaseStore, Reservation};
pub use machines::{
    ImportBatch, ImportBatches, MachineFilter, MachinePage, MachineRecord, MachineSort,
    MachineStore, MachineUpdate, PasswordChange,
};
pub use reinstalls::{Reinstall, ReinstallPolicy, ReinstallStore, Stage};
pub use tokens::{ApiRole, NewSession, NewToken, TokenInfo, TokenStore};

/// One handle per store port, all backed by one database: what `crate::store::open` returns and
/// what `app` hands out, port by port, to the use cases.
#[derive(Clone)]
pub struct Stores {
    /// Machines.
    pub machines: Arc<dyn MachineStore>,
    /// The event log.
    pub events: Arc<dyn EventStore>,
    /// API tokens.
    pub tokens: Arc<dyn TokenStore>,
    /// DHCP leases.
    pub leases: Arc<dyn LeaseStore>,
    /// Probed BMC capabilities.
    pub bmc_capabilities: Arc<dyn BmcCapabilityStore>,
    /// Declared config objects, served configs, provisioning windows.
    pub configs: Arc<dyn ConfigStore>,
    /// Reinstall workflows.
    pub reinstalls: Arc<dyn ReinstallStore>,
    /// Cluster bootstraps, node verifications, cluster health.
    pub talos: Arc<dyn talos_state::TalosStateStore>,
    /// Rolling upgrades.
    pub upgrades: Arc<dyn upgrades::UpgradeStore>,
    /// etcd snapshots, snapshot turns, recoveries.
    pub snapshots: Arc<dyn snapshots::SnapshotStore>,
    /// Reachability of the database.
    pub health: Arc<dyn StoreHealth>,
}

impl Stores {
    /// Every port of one store that implements them all.
    pub fn of<S>(store: Arc<S>) -> Stores
    where
        S: MachineStore
            + EventStore
            + TokenStore
            + LeaseStore
            + BmcCapabilityStore
            + ConfigStore
            + ReinstallStore
            + talos_state::TalosStateStore
            + upgrades::UpgradeStore
            + snapshots::SnapshotStore
            + StoreHealth,
    {
        Stores {
            machines: store.clone(),
            events: store.clone(),
            tokens: store.clone(),
            leases: store.clone(),
            bmc_capabilities: store.clone(),
            configs: store.clone(),
            reinstalls: store.clone(),
            talos: store.clone(),
            upgrades: store.clone(),
            snapshots: store.clone(),
            health: store,
        }
    }
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

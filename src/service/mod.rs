//! Use cases of Plinth and the ports they need from the outside world.
//!
//! Front doors (HTTP, DHCP, TFTP, the CLI) call the use cases: `provisioning` (the one answer to
//! what a machine boots now: `ProvisioningService`, `DhcpService`, `Identities`, the boot
//! `Timeline`), `inventory` (`Inventory`), `auth` (`Tokens`), `machine_config` (`ConfigService`),
//! `bmc` (`BmcService`), `workflow` (`Workflows`, reinstalls), `clusters` (`Clusters`: verified
//! install, bootstrap, health), `upgrade` (`Upgrades`: rolling Talos upgrades), `apply` (the
//! declarative inventory), `events` (`EventFeed`, the live feed), with `secrets` (`SecretBox`)
//! and `throttle` beside them. Each takes the ports it uses (`ports`: machines, events, tokens,
//! leases, BMC, configs, reinstalls, Talos API and its state, upgrades, images, store health) in
//! its constructor; `crate::store`, `crate::bmc`, `crate::images` and `crate::talos_api`
//! implement them. Errors: `ServiceError` (`error`).
//!
//! This module imports `domain`, `talos` and `metrics`, nothing from `store`, `bmc`, `images`,
//! `talos_api`, `http` or any front door. The names re-exported here are the layer's public face;
//! each lives in one module.

pub mod apply;
pub mod auth;
pub mod bmc;
pub mod clusters;
pub mod error;
pub mod events;
pub mod inventory;
pub mod machine_config;
pub mod ports;
pub mod provisioning;
pub mod sealed_stream;
pub mod secrets;
pub mod snapshots;
pub mod throttle;
pub mod upgrade;
pub mod workflow;

pub use auth::Tokens;
pub use bmc::BmcService;
pub use error::{MachineConfigError, ServiceError};
pub use events::{EventFeed, Follow};
pub use inventory::{ImportRow, Inventory, RowError};
pub use machine_config::{ClusterSecretInput, ConfigService, Refusal, RenderedMachine, Sources};
pub use ports::{
    ApiRole, BmcCapabilityStore, BmcConnector, CapabilityRecord, ClientFacts, ClusterRecord,
    ClusterSpec, ConfigStore, ConfigWrite, Event, EventFilter, EventStore, GroupKind, GroupSpec,
    Lease, LeaseClaim, LeaseState, LeaseStore, MachineFilter, MachinePage, MachinePatches,
    MachineRecord, MachineSort, MachineStore, NewEvent, NewSession, NewToken, PasswordChange,
    PatchSource, ProfileSpec, ProvisionWindow, Reinstall, ReinstallPolicy, ReinstallStore,
    Reservation, ServedConfig, Stage, StoreError, StoreHealth, Stores, TokenInfo, TokenStore,
};
pub use secrets::SecretBox;
pub use upgrade::{UpgradeSettings, Upgrades};
pub use workflow::{WorkflowSettings, Workflows};

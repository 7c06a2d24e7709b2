//! Use cases of Plinth and the ports they need from the outside world.
//!
//! Front doors (HTTP, DHCP, TFTP) call the use cases: `Inventory`, `Tokens`, `ConfigService`,
//! `BmcService`, `Workflows`, `DhcpService`, the boot `Timeline`. Each takes the ports it uses
//! (`ports`: machines, events, tokens, leases, BMC, configs, reinstalls, store health) in its
//! constructor; `crate::store` and `crate::bmc` implement them. Errors: `ServiceError` (`error`).
//!
//! This module imports `domain` and `talos`, nothing from `store`, `bmc`, `http` or any front
//! door. The names re-exported here are the layer's public face; each lives in one module.

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
pub mod secrets;
pub mod throttle;
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
pub use workflow::{WorkflowSettings, Workflows};

//! Use cases of the inventory and the traits they need from the outside world.
//!
//! Front doors (HTTP, later DHCP/TFTP) call `Inventory` and `BmcService`; stores implement
//! `InventoryStore` and `BmcCapabilityStore`, the Redfish client implements `bmc::Bmc`. This module
//! imports `domain` and nothing from `store`, `http` or any concrete database.

pub mod apply;
pub mod auth;
pub mod bmc;
pub mod clusters;
pub mod config;
pub mod dhcp;
pub mod inventory;
pub mod leases;
pub mod ports;
pub mod secrets;
pub mod store;
pub mod timeline;
pub mod workflow;

pub use auth::{ApiRole, NewToken, TokenInfo, Tokens};
pub use bmc::{BmcCapabilityStore, BmcConnector, BmcService, CapabilityRecord};
pub use config::{
    ClusterRecord, ClusterSecretInput, ClusterSpec, ConfigError, ConfigService, ConfigStore,
    ConfigWrite, GroupKind, GroupSpec, MachinePatches, PatchSource, ProfileSpec, ProvisionWindow,
    Refusal, RenderedMachine, ServedConfig, Sources,
};
pub use inventory::{ImportRow, Inventory, RowError};
pub use leases::{ClientFacts, Lease, LeaseClaim, LeaseState, LeaseStore, Reservation};
pub use secrets::SecretBox;
pub use store::*;
pub use workflow::{Reinstall, ReinstallPolicy, Stage, WorkflowSettings, Workflows};

use crate::domain::ValidationErrors;

/// Errors of the service layer; turned into protocol answers only at the edge (`http/error.rs`).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Input refused field by field.
    #[error("invalid input: {0}")]
    Invalid(ValidationErrors),
    /// No such thing.
    #[error("{0} not found")]
    NotFound(String),
    /// A unique value already belongs to another machine.
    #[error("conflict: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Conflict(Vec<Conflict>),
    /// The caller's version is stale.
    #[error("version {expected} is stale; the machine is at version {current}")]
    PreconditionFailed {
        /// What the caller sent.
        expected: i64,
        /// What the inventory holds.
        current: i64,
    },
    /// An edit came without `If-Match` or `version`.
    #[error("send If-Match with the machine's version (or `version` in the body) to edit it")]
    PreconditionRequired,
    /// A bulk import with bad rows: nothing was imported.
    #[error("import refused: {} bad row(s), nothing imported", .0.len())]
    ImportRejected(Vec<RowError>),
    /// The lifecycle does not allow this state change.
    #[error("a {from} machine cannot become {to}; from {from} it can become: {}", crate::domain::lifecycle::next_states(*from).iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    InvalidTransition {
        /// Current state.
        from: crate::domain::LifecycleState,
        /// Asked-for state.
        to: crate::domain::LifecycleState,
    },
    /// The store failed.
    #[error("store: {0}")]
    Store(#[source] StoreError),
    /// The machine has no BMC in the inventory.
    #[error("machine {0} has no BMC: set bmc.url, bmc.username and bmc.password first")]
    NoBmc(String),
    /// The BMC refused, failed, or did not do what was asked.
    #[error("BMC: {0}")]
    Bmc(#[source] bmc::BmcError),
    /// The action would break a rule that holds right now (a reinstall already running, etcd
    /// quorum, workers per rack).
    #[error("{0}")]
    Busy(String),
    /// A machine config cannot be rendered, or is invalid.
    #[error("machine config: {0}")]
    Config(#[source] config::ConfigError),
}

impl From<config::ConfigError> for ServiceError {
    fn from(e: config::ConfigError) -> Self {
        match e {
            config::ConfigError::Store(s) => ServiceError::from(s),
            other => ServiceError::Config(other),
        }
    }
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(c) => ServiceError::Conflict(c),
            StoreError::NotFound => ServiceError::NotFound("machine".into()),
            StoreError::VersionMismatch { expected, current } => {
                ServiceError::PreconditionFailed { expected, current }
            }
            other => ServiceError::Store(other),
        }
    }
}

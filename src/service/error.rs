//! The errors of the service layer: `ServiceError`, turned into a protocol answer only at the
//! edge (`http/error.rs`), and `MachineConfigError`, why a machine config cannot be rendered or
//! served, which folds into it. A store fault stays a store fault here (`Store`), never "not
//! found". Imports `domain` and the ports only.

use super::ports::bmc::BmcError;
use super::ports::StoreError;
use crate::domain::import::RowError;
use crate::domain::{Conflict, ValidationErrors};

/// Why a config could not be rendered (or must not be served).
#[derive(Debug, thiserror::Error)]
pub enum MachineConfigError {
    /// The machine names no cluster.
    #[error("machine has no cluster: set `cluster`")]
    NoCluster,
    /// The machine names no role.
    #[error("machine has no role: set `role` to control-plane or worker")]
    NoRole,
    /// The cluster is not declared.
    #[error("cluster `{0}` is not declared: add it to the inventory directory and `plinth apply`")]
    UnknownCluster(String),
    /// The profile is not declared.
    #[error("profile `{0}` is not declared")]
    UnknownProfile(String),
    /// A field of a declared cluster that does not make sense (its Talos version, schematic).
    #[error("cluster `{cluster}` {field}: {message}")]
    Cluster {
        /// The cluster.
        cluster: String,
        /// Its field, as the inventory directory spells it (`talosVersion`).
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The secrets could not be opened or generated from.
    #[error("cluster secrets: {0}")]
    Secrets(String),
    /// The install disk could not be decided from the profile's rules and the machine's disks.
    #[error("install disk: {message}")]
    Disk {
        /// The rule of the profile's `installDisk` at fault (`size`), when one is.
        rule: Option<&'static str>,
        /// What is wrong.
        message: String,
    },
    /// A patch does not load or does not apply.
    #[error("patch {origin} (layer {layer}): {message}")]
    Patch {
        /// The layer (`cluster`, `role:worker`, `rack:r12`, `profile:dell`, `machine`).
        layer: String,
        /// The patch: its file, or `file#document field[i]` for an inline one.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// Patching or writing the facts failed.
    #[error("render: {0}")]
    Render(String),
    /// The rendered config is invalid.
    #[error("the rendered config is invalid: {}", .0.join("; "))]
    Invalid(Vec<String>),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

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
    Bmc(#[source] BmcError),
    /// The action would break a rule that holds right now (a reinstall already running, etcd
    /// quorum, workers per rack).
    #[error("{0}")]
    Busy(String),
    /// A machine config cannot be rendered, or is invalid.
    #[error("machine config: {0}")]
    Config(#[source] MachineConfigError),
}

impl From<MachineConfigError> for ServiceError {
    fn from(e: MachineConfigError) -> Self {
        match e {
            MachineConfigError::Store(s) => ServiceError::from(s),
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

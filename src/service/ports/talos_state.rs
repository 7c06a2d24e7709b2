//! The store port of the Talos API use cases: each cluster's one bootstrap (claimed before the
//! call, its outcome after), what each node reported when its install was verified, and each
//! cluster's last measured health. Implemented by `crate::store` for SQLite and PostgreSQL; the
//! claim is a primary key on the cluster, so two instances on one database never both claim.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{NewEvent, StoreError};
use crate::domain::MachineId;

/// Where a cluster's bootstrap stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BootstrapState {
    /// Claimed and the call made (or about to be): the outcome is not known (yet).
    Calling,
    /// The node accepted it, or said its etcd was already initialised.
    Done,
    /// Plinth found the cluster's etcd running without having bootstrapped it.
    Found,
}

impl BootstrapState {
    /// The database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BootstrapState::Calling => "calling",
            BootstrapState::Done => "done",
            BootstrapState::Found => "found",
        }
    }
}

impl std::str::FromStr for BootstrapState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "calling" => BootstrapState::Calling,
            "done" => BootstrapState::Done,
            "found" => BootstrapState::Found,
            other => return Err(format!("`{other}` is not a bootstrap state")),
        })
    }
}

/// A cluster's bootstrap: when, on which node, by which instance, for whom.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BootstrapRecord {
    /// The cluster.
    pub cluster: String,
    /// This attempt (outcomes are written only for the attempt that claimed).
    pub attempt_id: Uuid,
    /// The machine, while it exists.
    pub machine_id: Option<MachineId>,
    /// The node's name when it was claimed.
    pub node: String,
    /// The node's address.
    pub node_address: String,
    /// The Plinth instance that claimed it.
    pub instance: String,
    /// `plinth` (automatic) or the token's name.
    pub requested_by: String,
    /// Where it stands.
    pub state: BootstrapState,
    /// Claimed at (the call follows).
    pub claimed_at: DateTime<Utc>,
    /// The outcome's time.
    pub finished_at: Option<DateTime<Utc>>,
    /// What the node said.
    pub detail: Option<String>,
}

/// What a node's Talos API reported when its install was verified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct NodeVerification {
    /// The machine.
    pub machine_id: MachineId,
    /// The address its API answered at.
    pub address: String,
    /// The Talos version it reported.
    pub talos_version: String,
    /// SHA-256 (hex) of its server certificate.
    pub cert_sha256: String,
    /// When.
    pub verified_at: DateTime<Utc>,
}

/// What the Talos API use cases need from a database.
#[async_trait]
pub trait TalosStateStore: Send + Sync {
    /// Claim the bootstrap of `r.cluster` with its event, in one transaction. `Ok(None)`: claimed;
    /// `Ok(Some(existing))`: the cluster's bootstrap was already claimed (nothing written).
    async fn claim_bootstrap(
        &self,
        r: &BootstrapRecord,
        event: &NewEvent,
    ) -> Result<Option<BootstrapRecord>, StoreError>;

    /// Write the outcome of attempt `attempt_id` (only while it is `calling`), with its event.
    async fn finish_bootstrap(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        state: BootstrapState,
        detail: &str,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<bool, StoreError>;

    /// Drop the claim of attempt `attempt_id` (only while `calling`) with its event: the call
    /// provably never reached the node, or the node refused before doing anything.
    async fn release_bootstrap(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        event: &NewEvent,
    ) -> Result<bool, StoreError>;

    /// A cluster's bootstrap, if claimed.
    async fn cluster_bootstrap(&self, cluster: &str)
        -> Result<Option<BootstrapRecord>, StoreError>;

    /// Remember what a node reported, replacing its earlier record, with its event.
    async fn record_verification(
        &self,
        v: &NodeVerification,
        event: &NewEvent,
    ) -> Result<(), StoreError>;

    /// Every node's last verification.
    async fn verifications(&self) -> Result<Vec<NodeVerification>, StoreError>;

    /// Store a cluster's health report (JSON) measured at `at`.
    async fn put_health(
        &self,
        cluster: &str,
        report: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// A cluster's last health report and when it was measured.
    async fn cluster_health(
        &self,
        cluster: &str,
    ) -> Result<Option<(String, DateTime<Utc>)>, StoreError>;
}

//! The `UpgradeStore` port: rolling Talos upgrades of a cluster (issue #20), kept in the database
//! so that a restarted Plinth, or another instance on the same PostgreSQL, resumes a rollout where
//! it stopped. One row per rollout, one per node of its plan (position, batch, the step it is at,
//! what Plinth saw last). The rules live in the schema and in compare-and-set writes:
//!
//! - one active (running or paused) rollout per cluster: a partial unique index, so two instances
//!   that start one at the same moment get one rollout and one refusal;
//! - one instance drives a rollout at a time: it holds a lease (`owner`, `lease_until`) and every
//!   write it makes is conditional on still holding it, so an instance that lost its lease (it
//!   stalled, or was killed and restarted under another name) writes nothing more;
//! - a node moves on only from the step the writer read (compare-and-set), so a finished node is
//!   never started again.
//!
//! The per-cluster upgrade policy (`upgrade:` of a Cluster in the inventory directory) is declared
//! here too. Imports `domain` and the other ports only.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::StoreError;
use super::events::NewEvent;
use crate::domain::{MachineId, Role};

/// Per-cluster upgrade policy (`upgrade:` of a Cluster in the inventory directory).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradePolicy {
    /// Workers of one rack upgraded at once (default: the cluster's
    /// `reinstall.maxWorkersPerRack`, else 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_workers_per_rack: Option<u32>,
    /// How long one node may take from the upgrade call to verified, seconds (default 1800).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_timeout_seconds: Option<u64>,
    /// How old the newest verified etcd snapshot may be when a rollout starts, seconds (default
    /// 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_max_age_seconds: Option<u64>,
}

/// Default of [`UpgradePolicy::node_timeout_seconds`].
pub const DEFAULT_NODE_TIMEOUT_SECONDS: u64 = 1800;
/// Default of [`UpgradePolicy::snapshot_max_age_seconds`].
pub const DEFAULT_SNAPSHOT_MAX_AGE_SECONDS: u64 = 3600;

macro_rules! spelled {
    ($(#[$m:meta])* $name:ident what $what:literal { $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
        pub enum $name { $($(#[$vm])* #[serde(rename = $s)] $v),+ }

        impl $name {
            /// The database and wire spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$v => $s),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($s => Ok($name::$v),)+
                    other => Err(format!(concat!("`{}` is not ", $what), other)),
                }
            }
        }
    };
}

spelled!(
    /// Where a rollout stands.
    RolloutState what "a rollout state" {
        /// Nodes are being upgraded (or the next one is about to be).
        Running = "running",
        /// A person paused it: the node in flight finishes, no further node starts.
        Paused = "paused",
        /// Every node runs the target version; the cluster's inventory follows.
        Done = "done",
        /// A node failed or rolled back: the rollout stopped there (see `error`).
        Failed = "failed",
        /// A person aborted it.
        Aborted = "aborted",
    }
);

impl RolloutState {
    /// Running or paused: the cluster's one active rollout.
    pub fn is_active(self) -> bool {
        matches!(self, RolloutState::Running | RolloutState::Paused)
    }
}

spelled!(
    /// Where one node of a rollout stands.
    NodeStep what "a node step" {
        /// Not started.
        Pending = "pending",
        /// The upgrade call(s) are being made.
        Upgrading = "upgrading",
        /// The node accepted the upgrade; Plinth waits for a new boot id.
        Rebooting = "rebooting",
        /// The node booted again; Plinth checks version, etcd, kubelet.
        Verifying = "verifying",
        /// Upgraded and verified.
        Done = "done",
        /// It already ran the target version when the rollout was planned.
        Skipped = "skipped",
        /// It failed (or missed its deadline): the rollout stopped here.
        Failed = "failed",
        /// It came back on its previous version (Talos' A/B fallback): the rollout stopped here.
        RolledBack = "rolled_back",
        /// The rollout was aborted while this node was in flight.
        Aborted = "aborted",
    }
);

impl NodeStep {
    /// Started and not finished.
    pub fn in_flight(self) -> bool {
        matches!(
            self,
            NodeStep::Upgrading | NodeStep::Rebooting | NodeStep::Verifying
        )
    }

    /// Finished well.
    pub fn succeeded(self) -> bool {
        matches!(self, NodeStep::Done | NodeStep::Skipped)
    }
}

spelled!(
    /// Which upgrade call a node gets, chosen by the Talos version it runs.
    UpgradeMethod what "an upgrade method" {
        /// `MachineService.Upgrade` (before Talos 1.13): the node reboots by itself.
        Machine = "machine",
        /// `ImageService.Pull`, `LifecycleService.Upgrade`, `MachineService.Reboot` (1.13+).
        Lifecycle = "lifecycle",
    }
);

/// A rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Rollout {
    /// Its id.
    pub id: Uuid,
    /// The cluster.
    pub cluster: String,
    /// The target Talos version.
    pub to_version: String,
    /// The Image Factory schematic of the target (`--schematic`), when it changes.
    pub schematic_id: Option<String>,
    /// The installer image of the target.
    pub installer: String,
    /// Where it stands.
    pub state: RolloutState,
    /// Who started it.
    pub requested_by: String,
    /// The Plinth instance driving it now.
    pub owner: Option<String>,
    /// Until when that instance's lease holds.
    pub lease_until: Option<DateTime<Utc>>,
    /// Each node's deadline, from its upgrade call to verified, seconds.
    pub node_timeout_seconds: u64,
    /// Workers of one rack per batch.
    pub max_workers_per_rack: u32,
    /// The etcd snapshot the pre-check found (id, time).
    #[schema(value_type = Option<Object>)]
    pub snapshot: Option<serde_json::Value>,
    /// Started at.
    pub created_at: DateTime<Utc>,
    /// Last written at.
    pub updated_at: DateTime<Utc>,
    /// Ended at.
    pub finished_at: Option<DateTime<Utc>>,
    /// Why it failed or who aborted it.
    pub error: Option<String>,
}

/// One node of a rollout's plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RolloutNode {
    /// The machine.
    pub machine_id: MachineId,
    /// Place in the order (0-based).
    pub position: u32,
    /// Batch: control planes one per batch, then workers at most `max_workers_per_rack` of
    /// each rack per batch.
    pub batch: u32,
    /// Host name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Rack.
    pub rack: Option<String>,
    /// Address of its Talos API.
    pub address: String,
    /// The version it ran when the rollout was planned.
    pub from_version: String,
    /// The upgrade call it gets.
    pub method: UpgradeMethod,
    /// Its installer image.
    pub installer: String,
    /// Where it stands.
    pub step: NodeStep,
    /// Its boot id before the upgrade call.
    pub boot_id: Option<String>,
    /// When its upgrade started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it fails if not verified by then.
    pub deadline: Option<DateTime<Utc>>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// What Plinth saw last (why it waits, or why it failed).
    pub seen: Option<String>,
}

/// What the cluster's inventory record becomes when a rollout is done, so that a later install
/// installs what the nodes run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterVersionUpdate {
    /// The cluster.
    pub cluster: String,
    /// `talosVersion`.
    pub talos_version: String,
    /// `schematicId`, when the rollout changed it.
    pub schematic_id: Option<String>,
    /// `installImage`, when the cluster declares one (its registry mirror, with the new tag).
    pub install_image: Option<String>,
}

/// How the driver ends a rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutEnd {
    /// `done` or `failed`.
    pub state: RolloutState,
    /// Why it failed.
    pub error: Option<String>,
    /// When.
    pub at: DateTime<Utc>,
    /// On `done`: what the cluster's inventory record becomes.
    pub update: Option<ClusterVersionUpdate>,
}

/// Rollouts and their nodes.
#[async_trait]
pub trait UpgradeStore: Send + Sync + 'static {
    /// Insert a rollout (state running or already ended) with its nodes and event, in one
    /// transaction. `Ok(Some(active))`: the cluster has an active rollout (nothing written).
    async fn create_rollout(
        &self,
        r: &Rollout,
        nodes: &[RolloutNode],
        event: &NewEvent,
    ) -> Result<Option<Rollout>, StoreError>;

    /// A rollout and its nodes (in plan order).
    async fn rollout(&self, id: Uuid) -> Result<Option<(Rollout, Vec<RolloutNode>)>, StoreError>;

    /// The cluster's newest rollout and its nodes.
    async fn latest_rollout(
        &self,
        cluster: &str,
    ) -> Result<Option<(Rollout, Vec<RolloutNode>)>, StoreError>;

    /// Every active (running or paused) rollout.
    async fn active_rollouts(&self) -> Result<Vec<Rollout>, StoreError>;

    /// Take the lease of a running rollout for `owner` until `until`: when nobody holds it, when
    /// `owner` does, or when the holder's lease ran out before `now`.
    async fn claim_rollout(
        &self,
        id: Uuid,
        owner: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// Extend `owner`'s lease (false: it lost it, or the rollout ended).
    async fn renew_rollout(
        &self,
        id: Uuid,
        owner: &str,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// Give the lease up.
    async fn release_rollout(&self, id: Uuid, owner: &str) -> Result<(), StoreError>;

    /// Write `node` (its step and what was seen) only if it is still at `from`, `owner` holds the
    /// rollout's lease, and the rollout is running (`start`: a node leaves `pending`) or active
    /// (any other move); with its event.
    async fn advance_node(
        &self,
        id: Uuid,
        owner: &str,
        node: &RolloutNode,
        from: NodeStep,
        event: Option<&NewEvent>,
    ) -> Result<bool, StoreError>;

    /// A person's move (pause, resume, abort): `to` only from one of `from`, with `note` as the
    /// rollout's error text when given; an abort also marks the nodes in flight aborted. The
    /// rollout as it is after, or `None` when it was in none of `from`.
    async fn set_rollout_state(
        &self,
        id: Uuid,
        from: &[RolloutState],
        to: RolloutState,
        note: Option<&str>,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<Option<Rollout>, StoreError>;

    /// The driver ends the rollout (`done` or `failed`) while holding its lease, with its event;
    /// on `done` the cluster's inventory record takes `end.update` in the same transaction.
    async fn end_rollout(
        &self,
        id: Uuid,
        owner: &str,
        end: &RolloutEnd,
        event: &NewEvent,
    ) -> Result<bool, StoreError>;
}

//! Rolling Talos upgrades of a cluster (issue #20): plan, pre-checks, and a rollout that upgrades
//! one node (or one batch of workers) at a time and survives a restart of Plinth.
//!
//! The plan: control planes one at a time (the etcd leader last, so the cluster elects a new
//! leader once), then workers in batches of at most `maxWorkersPerRack` of each rack; each node
//! with the installer image of the target (Image Factory's for the cluster's schematic, or the
//! cluster's declared `installImage` re-tagged: its registry mirror) and the upgrade call its
//! current Talos version offers: `MachineService.Upgrade` before 1.13 (the node pulls, checks
//! etcd, installs into its other boot slot, cordons, drains and reboots by itself),
//! `ImageService.Pull` + `LifecycleService.Upgrade` + `MachineService.Reboot` from 1.13 (the
//! installer streams its progress and an exit code; the node reboots only when asked).
//!
//! Pre-checks, each named in a refusal: the upgrade path (no downgrade, no skipped minor release,
//! something to do), every node healthy (installed, Talos API up, apid/kubelet/etcd running and
//! healthy, Talos' own cluster check), etcd at full quorum (every member healthy, a leader, not
//! two members), a verified etcd snapshot no older than `snapshotMaxAgeSeconds` (else starting the
//! rollout takes and verifies one first, and is refused if that fails), no other rollout.
//!
//! Per node: its boot id is read, the upgrade call made, then Plinth waits for a new boot id,
//! then verifies the new version, etcd membership and health, kubelet. A node that comes back on
//! its previous version was rolled back by Talos' A/B fallback: reported, and the rollout stops.
//! A node that is not verified by its deadline stops the rollout: the next node never starts, and
//! the node's row says what Plinth saw last. Before each control plane, etcd must again have every
//! member healthy: at most one control plane is ever down.
//!
//! Nothing is kept in memory: the rollout and each node's step are rows (`UpgradeStore`). One
//! instance drives a rollout under a lease; a restarted Plinth (or another instance) takes it
//! over once the lease ran out and carries on from each node's step (a node whose upgrade call's
//! answer was lost is asked for its boot id first, so a node that already rebooted is not called
//! again); a node that is done is never started again. When every node is done, the cluster's
//! inventory record takes the new `talosVersion` (and schematic or installer), so a later
//! reinstall installs what the nodes run.
//!
//! Imports `domain`, `talos` (versions, installer images) and the rest of `service`; nothing from
//! `store`, `http` or `talos_api`.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::clusters::{ClusterHealth, Clusters};
use super::error::ServiceError;
use super::ports::talos_api::{ServiceStatus, StatusCode, TalosApiError, TalosApiFailure};
use super::ports::upgrades::{
    ClusterVersionUpdate, NodeStep, Rollout, RolloutEnd, RolloutNode, RolloutState, UpgradeMethod,
    UpgradeStore, DEFAULT_NODE_TIMEOUT_SECONDS, DEFAULT_SNAPSHOT_MAX_AGE_SECONDS,
};
use super::ports::{ClusterSpec, NewEvent};
use crate::domain::validate::FieldError;
use crate::domain::{LifecycleState, Role, ValidationErrors};
use crate::talos::schematic::{installer_image, SchematicId};
use crate::talos::TalosVersion;

/// Knobs of the rollout driver (`[upgrades]` in the config).
#[derive(Clone, Debug)]
pub struct UpgradeSettings {
    /// This instance's name, recorded as the driver of the rollouts it drives.
    pub instance: String,
    /// How long a driver's lease lasts without renewal: how soon another instance takes over a
    /// rollout whose driver died.
    pub lease: StdDuration,
    /// How often rollouts are looked at and nodes asked.
    pub poll: StdDuration,
    /// Longest image pull, and longest install, on one node.
    pub install_wait: StdDuration,
}

impl Default for UpgradeSettings {
    fn default() -> Self {
        UpgradeSettings {
            instance: super::clusters::default_instance(),
            lease: StdDuration::from_secs(30),
            poll: StdDuration::from_secs(2),
            install_wait: StdDuration::from_secs(15 * 60),
        }
    }
}

/// The newest verified etcd snapshot of a cluster, as the pre-check needs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VerifiedSnapshot {
    /// Its id (what recovery takes).
    pub id: String,
    /// When it was taken.
    pub taken_at: DateTime<Utc>,
    /// When it was read back and verified.
    pub verified_at: Option<DateTime<Utc>>,
    /// etcd's revision in it.
    pub revision: Option<i64>,
    /// Where it is kept (no credentials).
    pub store: Option<String>,
}

/// Where the pre-check learns of a cluster's etcd snapshots, and how a rollout takes one when
/// the newest is not fresh (`service::snapshots::Snapshots`).
#[async_trait]
pub trait SnapshotCheck: Send + Sync + 'static {
    /// The newest snapshot of `cluster` that was stored and verified.
    async fn latest_verified(
        &self,
        cluster: &str,
    ) -> Result<Option<VerifiedSnapshot>, ServiceError>;

    /// Take a snapshot of `cluster` now for `actor`, store it and verify it: the verified
    /// snapshot, or why there is none.
    async fn take_verified(&self, cluster: &str, actor: &str) -> Result<VerifiedSnapshot, String>;
}

/// The name of the snapshot pre-check.
const SNAPSHOT_CHECK: &str = "etcd snapshot";

/// One pre-check and its verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PreCheck {
    /// `upgrade path`, `nodes healthy`, `etcd quorum`, `etcd snapshot`, `no rollout running`.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// What was found.
    pub detail: String,
}

/// What a rollout would do (`--dry-run`), and what it was started with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct UpgradePlan {
    /// The cluster.
    pub cluster: String,
    /// The target Talos version.
    pub to_version: String,
    /// The schematic of the target's installer.
    pub schematic_id: String,
    /// The installer image of the target.
    pub installer: String,
    /// Workers of one rack per batch.
    pub max_workers_per_rack: u32,
    /// Each node's deadline, seconds.
    pub node_timeout_seconds: u64,
    /// The pre-checks, in order.
    pub checks: Vec<PreCheck>,
    /// The nodes in order (step `pending`, or `skipped` when already on the target).
    pub nodes: Vec<RolloutNode>,
    /// The snapshot the pre-check found.
    pub snapshot: Option<VerifiedSnapshot>,
    /// Things to know.
    pub notes: Vec<String>,
}

impl UpgradePlan {
    /// The checks that failed.
    pub fn failed(&self) -> Vec<&PreCheck> {
        self.checks.iter().filter(|c| !c.passed).collect()
    }
}

/// A rollout with its nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RolloutStatus {
    /// The rollout.
    pub rollout: Rollout,
    /// Its nodes in order.
    pub nodes: Vec<RolloutNode>,
}

/// Why an upgrade was not started (or paused, resumed, aborted).
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// A pre-check failed.
    #[error("{}", refused_text(.0))]
    Refused(Box<UpgradePlan>),
    /// The cluster has an active rollout.
    #[error("cluster {} has an active rollout: {} ({}) to {}, started by {} at {}; see --status, or --resume / --abort it", .0.cluster, .0.id, .0.state, .0.to_version, .0.requested_by, .0.created_at.to_rfc3339())]
    Already(Box<Rollout>),
    /// Nothing to pause, resume or abort, or a plan that cannot be made.
    #[error("{0}")]
    NotPossible(String),
    /// Anything else (store, Talos API credentials, bad input).
    #[error(transparent)]
    Service(#[from] ServiceError),
}

fn refused_text(p: &UpgradePlan) -> String {
    let failed: Vec<String> = p
        .failed()
        .iter()
        .map(|c| format!("pre-check `{}` failed: {}", c.name, c.detail))
        .collect();
    format!(
        "the upgrade of cluster {} to {} is refused: {}",
        p.cluster,
        p.to_version,
        failed.join("; ")
    )
}

fn invalid(field: &str, why: impl Into<String>) -> UpgradeError {
    UpgradeError::Service(ServiceError::Invalid(ValidationErrors(vec![
        FieldError::new(field, why.into()),
    ])))
}

/// Which upgrade call a node running `tag` gets: `LifecycleService.Upgrade` exists from Talos
/// 1.13.0-alpha.3 on (talosctl uses it for versions above 1.13.0-alpha.2), `MachineService.Upgrade`
/// before (and is deprecated after).
pub fn method_for(tag: &str) -> UpgradeMethod {
    let Ok(v) = tag.parse::<TalosVersion>() else {
        return UpgradeMethod::Machine;
    };
    if v < TalosVersion::new(1, 13, 0) {
        return UpgradeMethod::Machine;
    }
    let early = ["-alpha.0", "-alpha.1", "-alpha.2"];
    if v == TalosVersion::new(1, 13, 0) && early.iter().any(|s| tag.contains(s)) {
        return UpgradeMethod::Machine;
    }
    UpgradeMethod::Lifecycle
}

/// Why the upgrade from `from` to `to` is not a supported path, if it is not.
fn path_problem(from: &str, to: TalosVersion, to_tag: &str) -> Option<String> {
    let Ok(f) = from.parse::<TalosVersion>() else {
        return Some(format!(
            "reports version `{from}`, which is not a Talos version"
        ));
    };
    if to < f {
        return Some(format!(
            "runs {from}: {to_tag} would be a downgrade (Plinth never downgrades; `talosctl rollback` returns a node to its previous boot slot)"
        ));
    }
    if to.major != f.major || to.minor > f.minor + 1 {
        return Some(format!(
            "runs {from}: {to_tag} skips a minor release (Talos tests upgrades between adjacent minor releases only: upgrade to the latest v{}.{}.x first)",
            f.major,
            f.minor + 1
        ));
    }
    None
}

/// `image` with its tag replaced by `tag` (`registry.lab/siderolabs/installer:v1.12.11` ->
/// `...:v1.13.9`).
fn retag(image: &str, tag: &str) -> Result<String, String> {
    if image.contains('@') {
        return Err(format!(
            "the cluster's installImage `{image}` pins a digest: Plinth cannot derive the target's image from it; declare the target's installImage (or drop installImage to use Image Factory's)"
        ));
    }
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    let repo = match image[slash..].rfind(':') {
        Some(i) => &image[..slash + i],
        None => image,
    };
    Ok(format!("{repo}:{tag}"))
}

/// The target's installer, the schematic it carries, and the cluster's new `installImage` (when
/// it declares one).
fn target_installer(
    spec: &ClusterSpec,
    to: TalosVersion,
    to_tag: &str,
    schematic: Option<&SchematicId>,
) -> Result<(String, String, Option<String>), UpgradeError> {
    match &spec.install_image {
        Some(image) => {
            if schematic.is_some() {
                return Err(UpgradeError::NotPossible(format!(
                    "cluster {} declares installImage `{image}`: --schematic applies to Image Factory installers only",
                    spec.name
                )));
            }
            let new = retag(image, to_tag).map_err(UpgradeError::NotPossible)?;
            Ok((new.clone(), spec.schematic_id.clone(), Some(new)))
        }
        None => {
            let id = match schematic {
                Some(s) => s.clone(),
                None => SchematicId::parse(&spec.schematic_id).ok_or_else(|| {
                    UpgradeError::NotPossible(format!(
                        "cluster {}: `{}` is not a schematic id",
                        spec.name, spec.schematic_id
                    ))
                })?,
            };
            let mut image = installer_image(&spec.factory_host, &id, to);
            // Keep a pre-release suffix the caller gave (`v1.14.0-beta.1`).
            if to.to_string() != to_tag {
                image = retag(&image, to_tag).map_err(UpgradeError::NotPossible)?;
            }
            Ok((image, id.as_str().to_string(), None))
        }
    }
}

/// The services a node must have running and healthy.
fn required_services(role: Role) -> &'static [&'static str] {
    match role {
        Role::ControlPlane => &["apid", "etcd", "kubelet"],
        Role::Worker => &["apid", "kubelet"],
    }
}

/// What is wrong with the services of a node of `role`.
fn service_problems(role: Role, services: &[ServiceStatus]) -> Vec<String> {
    required_services(role)
        .iter()
        .filter_map(|id| match services.iter().find(|s| s.id == *id) {
            None => Some(format!("{id} is not running")),
            Some(s) if s.state != "Running" => Some(format!("{id} is {}", s.state)),
            Some(s) if s.healthy != Some(true) => Some(if s.message.is_empty() {
                format!("{id} is not healthy")
            } else {
                format!("{id} is not healthy ({})", s.message)
            }),
            Some(_) => None,
        })
        .collect()
}

fn node_event(r: &Rollout, n: &RolloutNode, kind: &str, extra: serde_json::Value) -> NewEvent {
    let mut detail = serde_json::json!({
        "cluster": r.cluster, "rollout": r.id, "node": n.name, "role": n.role,
        "address": n.address, "batch": n.batch, "position": n.position,
        "from": n.from_version, "to": r.to_version, "method": n.method,
    });
    if let (Some(o), Some(e)) = (detail.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    NewEvent {
        machine_id: Some(n.machine_id),
        kind: kind.into(),
        actor: "plinth".into(),
        detail,
    }
}

fn rollout_event(r: &Rollout, kind: &str, actor: &str, extra: serde_json::Value) -> NewEvent {
    let mut detail = serde_json::json!({"cluster": r.cluster, "rollout": r.id, "to": r.to_version});
    if let (Some(o), Some(e)) = (detail.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    NewEvent {
        machine_id: None,
        kind: kind.into(),
        actor: actor.into(),
        detail,
    }
}

/// A Talos API failure that may pass (the node is rebooting, or busy): wait and ask again.
fn transient(e: &TalosApiError) -> bool {
    matches!(
        e.failure,
        TalosApiFailure::Unreachable
            | TalosApiFailure::Timeout
            | TalosApiFailure::Refused(StatusCode::Unavailable)
    )
}

/// The upgrade use cases.
#[derive(Clone)]
pub struct Upgrades {
    clusters: Clusters,
    store: Arc<dyn UpgradeStore>,
    snapshots: Arc<dyn SnapshotCheck>,
    settings: UpgradeSettings,
    driving: Arc<Mutex<HashSet<Uuid>>>,
    wake: Arc<tokio::sync::Notify>,
}

/// What one look at a node in flight decided.
enum Move {
    /// Write the node as it is now (a new step, or what was seen), with an event if any.
    To(Box<RolloutNode>, Option<NewEvent>),
    /// Nothing new.
    Stay,
}

impl Upgrades {
    /// Over the cluster use cases (Talos API, health), the rollouts, and the etcd snapshots.
    pub fn new(
        clusters: Clusters,
        store: Arc<dyn UpgradeStore>,
        snapshots: Arc<dyn SnapshotCheck>,
        settings: UpgradeSettings,
    ) -> Self {
        Upgrades {
            clusters,
            store,
            snapshots,
            settings,
            driving: Arc::default(),
            wake: Arc::default(),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &UpgradeSettings {
        &self.settings
    }

    /// The pre-checks and the order of an upgrade of `cluster` to `to` (with the installer of
    /// `schematic`, default the cluster's), measured now.
    pub async fn plan(
        &self,
        cluster: &str,
        to: &str,
        schematic: Option<&str>,
    ) -> Result<UpgradePlan, UpgradeError> {
        let spec = self.clusters.spec(cluster).await?;
        let to = to.trim();
        let target: TalosVersion = to.parse().map_err(|e| invalid("to", format!("{e}")))?;
        let to_tag = if to.starts_with('v') {
            to.to_string()
        } else {
            format!("v{to}")
        };
        let schematic = match schematic {
            Some(s) => Some(SchematicId::parse(s.trim()).ok_or_else(|| {
                invalid(
                    "schematic",
                    format!(
                        "`{s}` is not an Image Factory schematic id (64 lower-case hex digits)"
                    ),
                )
            })?),
            None => None,
        };
        let (installer, schematic_id, _) =
            target_installer(&spec, target, &to_tag, schematic.as_ref())?;
        let policy = spec.upgrade.clone().unwrap_or_default();
        let per_rack = policy
            .max_workers_per_rack
            .or(spec.reinstall.as_ref().map(|r| r.max_workers_per_rack))
            .unwrap_or(1)
            .max(1);
        let timeout = policy
            .node_timeout_seconds
            .unwrap_or(DEFAULT_NODE_TIMEOUT_SECONDS);
        let max_age = policy
            .snapshot_max_age_seconds
            .unwrap_or(DEFAULT_SNAPSHOT_MAX_AGE_SECONDS);

        let health = self.clusters.measure(cluster).await?;
        let machines = self.clusters.cluster_nodes(cluster).await?;
        let rack_of = |id| {
            machines
                .iter()
                .find(|(m, _)| m.id == id)
                .and_then(|(m, _)| m.rack.clone())
        };
        let mut checks = Vec::new();
        let mut notes = Vec::new();

        // The upgrade path.
        let mut path = Vec::new();
        let mut on_target = 0;
        for n in &health.nodes {
            match &n.talos_version {
                Some(v) if *v == to_tag => on_target += 1,
                Some(v) => {
                    if let Some(p) = path_problem(v, target, &to_tag) {
                        path.push(format!("{} {p}", n.machine));
                    }
                }
                None => {}
            }
        }
        if health.nodes.is_empty() {
            path.push(format!("cluster {cluster} has no machines"));
        } else if on_target == health.nodes.len() {
            path.push(format!(
                "every node runs {to_tag} already: nothing to upgrade"
            ));
        }
        checks.push(PreCheck {
            name: "upgrade path".into(),
            passed: path.is_empty(),
            detail: if path.is_empty() {
                format!("every node can go to {to_tag}")
            } else {
                path.join("; ")
            },
        });

        // Every node healthy.
        checks.push(nodes_check(&health));

        // etcd at full quorum.
        checks.push(etcd_check(&health));

        // A fresh verified snapshot.
        let snapshot = self.snapshots.latest_verified(cluster).await?;
        let now = Utc::now();
        checks.push(match &snapshot {
            None => PreCheck {
                name: SNAPSHOT_CHECK.into(),
                passed: false,
                detail: format!(
                    "no verified etcd snapshot of cluster {cluster} is recorded: starting the rollout takes and verifies one first (or take one with `plinth cluster snapshot {cluster}`)"
                ),
            },
            Some(s) => {
                let age = now - s.taken_at;
                let fresh = age <= Duration::seconds(i64::try_from(max_age).unwrap_or(i64::MAX));
                PreCheck {
                    name: SNAPSHOT_CHECK.into(),
                    passed: fresh,
                    detail: if fresh {
                        format!(
                            "snapshot {} taken {} ({}s ago), verified",
                            s.id,
                            s.taken_at.to_rfc3339(),
                            age.num_seconds()
                        )
                    } else {
                        format!(
                            "the newest verified snapshot, {}, was taken {} ({}s ago), longer ago than upgrade.snapshotMaxAgeSeconds ({max_age}s): starting the rollout takes and verifies a fresh one first",
                            s.id,
                            s.taken_at.to_rfc3339(),
                            age.num_seconds()
                        )
                    },
                }
            }
        });

        // No other rollout.
        let running = match self
            .store
            .latest_rollout(cluster)
            .await
            .map_err(ServiceError::from)?
        {
            Some((r, _)) if r.state.is_active() => Some(r),
            _ => None,
        };
        checks.push(PreCheck {
            name: "no rollout running".into(),
            passed: running.is_none(),
            detail: match &running {
                None => "no other rollout of the cluster is active".into(),
                Some(r) => format!(
                    "rollout {} to {} ({}) started by {} at {} is active: see --status, or --resume / --abort it",
                    r.id,
                    r.to_version,
                    r.state,
                    r.requested_by,
                    r.created_at.to_rfc3339()
                ),
            },
        });

        // The order: control planes one at a time, the etcd leader last; then workers, at most
        // `per_rack` of each rack per batch.
        let leader = health.etcd.as_ref().and_then(|e| e.leader_hostname.clone());
        let mut cps: Vec<_> = health
            .nodes
            .iter()
            .filter(|n| n.role == Some(Role::ControlPlane))
            .collect();
        cps.sort_by_key(|n| (Some(&n.machine) == leader.as_ref(), n.machine.clone()));
        let mut racks: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for n in health
            .nodes
            .iter()
            .filter(|n| n.role != Some(Role::ControlPlane))
        {
            racks
                .entry(rack_of(n.machine_id).unwrap_or_default())
                .or_default()
                .push(n);
        }
        let mut order: Vec<(u32, &super::clusters::NodeHealth)> = Vec::new();
        for (i, n) in cps.iter().enumerate() {
            order.push((i as u32, n));
        }
        let first_worker_batch = cps.len() as u32;
        let mut workers: Vec<(u32, String, &super::clusters::NodeHealth)> = Vec::new();
        for (rack, mut list) in racks {
            list.sort_by(|a, b| a.machine.cmp(&b.machine));
            for (i, n) in list.into_iter().enumerate() {
                workers.push((first_worker_batch + i as u32 / per_rack, rack.clone(), n));
            }
        }
        workers.sort_by(|a, b| (a.0, &a.1, &a.2.machine).cmp(&(b.0, &b.1, &b.2.machine)));
        order.extend(workers.into_iter().map(|(b, _, n)| (b, n)));
        let nodes: Vec<RolloutNode> = order
            .into_iter()
            .enumerate()
            .map(|(i, (batch, n))| {
                let from = n.talos_version.clone().unwrap_or_else(|| "unknown".into());
                let skip = from == to_tag;
                RolloutNode {
                    machine_id: n.machine_id,
                    position: i as u32,
                    batch,
                    name: n.machine.clone(),
                    role: n.role.unwrap_or(Role::Worker),
                    rack: rack_of(n.machine_id),
                    address: n.address.clone().unwrap_or_default(),
                    method: method_for(&from),
                    from_version: from,
                    installer: installer.clone(),
                    step: if skip {
                        NodeStep::Skipped
                    } else {
                        NodeStep::Pending
                    },
                    boot_id: None,
                    started_at: None,
                    deadline: None,
                    finished_at: None,
                    seen: skip.then(|| format!("runs {to_tag} already")),
                }
            })
            .collect();
        if cps.len() == 1 {
            notes.push(
                "one control plane: etcd and the Kubernetes API are down while it reboots".into(),
            );
        }
        if nodes.iter().any(|n| n.method == UpgradeMethod::Lifecycle) {
            notes.push(
                "nodes on Talos 1.13 or later get ImageService.Pull, LifecycleService.Upgrade, then MachineService.Reboot: Talos stops their pods as it reboots, but Plinth does not drain them through Kubernetes first".into(),
            );
        }
        if nodes.iter().any(|n| n.method == UpgradeMethod::Machine) {
            notes.push(
                "nodes before Talos 1.13 get MachineService.Upgrade: each cordons and drains itself, installs and reboots".into(),
            );
        }
        Ok(UpgradePlan {
            cluster: cluster.to_string(),
            to_version: to_tag,
            schematic_id,
            installer,
            max_workers_per_rack: per_rack,
            node_timeout_seconds: timeout,
            checks,
            nodes,
            snapshot,
            notes,
        })
    }

    /// Start a rollout of `cluster` to `to` for `actor`, once every pre-check passed.
    pub async fn start(
        &self,
        cluster: &str,
        to: &str,
        schematic: Option<&str>,
        actor: &str,
    ) -> Result<RolloutStatus, UpgradeError> {
        let mut plan = self.plan(cluster, to, schematic).await?;
        if plan.failed().iter().all(|c| c.name == SNAPSHOT_CHECK) && !plan.failed().is_empty() {
            // Only the snapshot is missing or stale: take and verify one, then measure again.
            match self.snapshots.take_verified(cluster, actor).await {
                Ok(_) => plan = self.plan(cluster, to, schematic).await?,
                Err(why) => {
                    if let Some(c) = plan.checks.iter_mut().find(|c| c.name == SNAPSHOT_CHECK) {
                        c.detail = format!(
                            "{}; the snapshot taken for the rollout failed: {why}",
                            c.detail
                        );
                    }
                }
            }
        }
        if !plan.failed().is_empty() {
            return Err(UpgradeError::Refused(Box::new(plan)));
        }
        let spec = self.clusters.spec(cluster).await?;
        let now = Utc::now();
        let rollout = Rollout {
            id: Uuid::new_v4(),
            cluster: cluster.to_string(),
            to_version: plan.to_version.clone(),
            schematic_id: (plan.schematic_id != spec.schematic_id)
                .then(|| plan.schematic_id.clone()),
            installer: plan.installer.clone(),
            state: RolloutState::Running,
            requested_by: actor.to_string(),
            owner: None,
            lease_until: None,
            node_timeout_seconds: plan.node_timeout_seconds,
            max_workers_per_rack: plan.max_workers_per_rack,
            snapshot: plan
                .snapshot
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok()),
            created_at: now,
            updated_at: now,
            finished_at: None,
            error: None,
        };
        let event = rollout_event(
            &rollout,
            "upgrade.started",
            actor,
            serde_json::json!({
                "installer": rollout.installer,
                "order": plan.nodes.iter().map(|n| serde_json::json!({
                    "node": n.name, "batch": n.batch, "method": n.method, "step": n.step,
                })).collect::<Vec<_>>(),
                "snapshot": rollout.snapshot,
                "checks": plan.checks,
            }),
        );
        if let Some(existing) = self
            .store
            .create_rollout(&rollout, &plan.nodes, &event)
            .await
            .map_err(ServiceError::from)?
        {
            return Err(UpgradeError::Already(Box::new(existing)));
        }
        tracing::info!(cluster, rollout = %rollout.id, to = %rollout.to_version, actor, "upgrade rollout started");
        self.wake.notify_one();
        Ok(RolloutStatus {
            rollout,
            nodes: plan.nodes,
        })
    }

    /// The cluster's newest rollout.
    pub async fn status(&self, cluster: &str) -> Result<RolloutStatus, UpgradeError> {
        self.clusters.spec(cluster).await?;
        match self
            .store
            .latest_rollout(cluster)
            .await
            .map_err(ServiceError::from)?
        {
            Some((rollout, nodes)) => Ok(RolloutStatus { rollout, nodes }),
            None => Err(
                ServiceError::NotFound(format!("an upgrade rollout of cluster {cluster}")).into(),
            ),
        }
    }

    /// The cluster's newest rollout, if it ever had one (`status` without the 404).
    pub async fn latest(&self, cluster: &str) -> Result<Option<RolloutStatus>, ServiceError> {
        Ok(self
            .store
            .latest_rollout(cluster)
            .await?
            .map(|(rollout, nodes)| RolloutStatus { rollout, nodes }))
    }

    async fn change(
        &self,
        cluster: &str,
        from: &[RolloutState],
        to: RolloutState,
        kind: &str,
        actor: &str,
    ) -> Result<RolloutStatus, UpgradeError> {
        let current = self.status(cluster).await?;
        let r = &current.rollout;
        let note = (to == RolloutState::Aborted).then(|| format!("aborted by {actor}"));
        let event = rollout_event(r, kind, actor, serde_json::json!({"from_state": r.state}));
        match self
            .store
            .set_rollout_state(r.id, from, to, note.as_deref(), Utc::now(), &event)
            .await
            .map_err(ServiceError::from)?
        {
            Some(_) => {
                tracing::info!(cluster, rollout = %r.id, state = %to, actor, "upgrade rollout changed");
                self.wake.notify_one();
                self.status(cluster).await
            }
            None => {
                Err(UpgradeError::NotPossible(format!(
                "cluster {cluster}'s rollout {} to {} is {}: it cannot become {to} (from {} only)",
                r.id,
                r.to_version,
                r.state,
                from.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" or ")
            )))
            }
        }
    }

    /// Pause the cluster's running rollout: the node in flight finishes, no further node starts.
    pub async fn pause(&self, cluster: &str, actor: &str) -> Result<RolloutStatus, UpgradeError> {
        self.change(
            cluster,
            &[RolloutState::Running],
            RolloutState::Paused,
            "upgrade.paused",
            actor,
        )
        .await
    }

    /// Resume the cluster's paused rollout.
    pub async fn resume(&self, cluster: &str, actor: &str) -> Result<RolloutStatus, UpgradeError> {
        self.change(
            cluster,
            &[RolloutState::Paused],
            RolloutState::Running,
            "upgrade.resumed",
            actor,
        )
        .await
    }

    /// Abort the cluster's active rollout: no further call is made; nodes in flight are marked.
    pub async fn abort(&self, cluster: &str, actor: &str) -> Result<RolloutStatus, UpgradeError> {
        self.change(
            cluster,
            &[RolloutState::Running, RolloutState::Paused],
            RolloutState::Aborted,
            "upgrade.aborted",
            actor,
        )
        .await
    }

    /// Whether `cluster` has an active rollout (reinstalls wait for it).
    pub async fn active_rollout(&self, cluster: &str) -> Result<Option<Rollout>, ServiceError> {
        Ok(match self.store.latest_rollout(cluster).await? {
            Some((r, _)) if r.state.is_active() => Some(r),
            _ => None,
        })
    }

    /// Drive rollouts until `stop`: take over every running rollout nobody drives (or whose
    /// driver's lease ran out) and move it on.
    pub async fn run(self, stop: CancellationToken) {
        loop {
            if let Err(e) = self.claim_rollouts(&stop).await {
                tracing::warn!(error = %e, "upgrade rollouts: cannot look at them");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.settings.poll) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    async fn claim_rollouts(&self, stop: &CancellationToken) -> Result<(), ServiceError> {
        for r in self.store.active_rollouts().await? {
            if r.state != RolloutState::Running {
                continue;
            }
            if self
                .driving
                .lock()
                .map(|d| d.contains(&r.id))
                .unwrap_or(true)
            {
                continue;
            }
            let now = Utc::now();
            let until =
                now + Duration::from_std(self.settings.lease).unwrap_or(Duration::seconds(30));
            if !self
                .store
                .claim_rollout(r.id, &self.settings.instance, now, until)
                .await?
            {
                continue;
            }
            if let Ok(mut d) = self.driving.lock() {
                d.insert(r.id);
            }
            tracing::info!(cluster = %r.cluster, rollout = %r.id, instance = %self.settings.instance,
                previous = ?r.owner, "upgrade rollout: driving it");
            let (me, stop, id) = (self.clone(), stop.clone(), r.id);
            tokio::spawn(async move {
                if let Err(e) = me.drive(id, stop).await {
                    tracing::warn!(rollout = %id, error = %e, "upgrade rollout: driver stopped; it is taken up again");
                }
                if let Ok(mut d) = me.driving.lock() {
                    d.remove(&id);
                }
            });
        }
        Ok(())
    }

    /// Keep the lease of rollout `id` while `lost` is not cancelled; cancel it when the lease is
    /// lost (another instance took over, or the rollout ended).
    fn keep_lease(&self, id: Uuid, lost: CancellationToken) -> tokio::task::JoinHandle<()> {
        let (store, owner, lease) = (
            self.store.clone(),
            self.settings.instance.clone(),
            self.settings.lease,
        );
        tokio::spawn(async move {
            let lease_c = Duration::from_std(lease).unwrap_or(Duration::seconds(30));
            let mut held_until = Utc::now() + lease_c;
            loop {
                tokio::select! {
                    _ = lost.cancelled() => return,
                    _ = tokio::time::sleep(lease / 3) => {}
                }
                let until = Utc::now() + lease_c;
                match store.renew_rollout(id, &owner, until).await {
                    Ok(true) => held_until = until,
                    Ok(false) => {
                        lost.cancel();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(rollout = %id, error = %e, "upgrade rollout: cannot renew the lease");
                        if Utc::now() >= held_until {
                            lost.cancel();
                            return;
                        }
                    }
                }
            }
        })
    }

    async fn drive(&self, id: Uuid, stop: CancellationToken) -> Result<(), ServiceError> {
        let owner = self.settings.instance.clone();
        let lost = CancellationToken::new();
        let keeper = self.keep_lease(id, lost.clone());
        let result = self.drive_loop(id, &owner, &stop, &lost).await;
        lost.cancel();
        let _ = keeper.await;
        if stop.is_cancelled() {
            // Shutting down: let another instance take over at once.
            let _ = self.store.release_rollout(id, &owner).await;
        }
        result
    }

    async fn drive_loop(
        &self,
        id: Uuid,
        owner: &str,
        stop: &CancellationToken,
        lost: &CancellationToken,
    ) -> Result<(), ServiceError> {
        let mut gate_since: Option<DateTime<Utc>> = None;
        loop {
            if lost.is_cancelled() || stop.is_cancelled() {
                return Ok(());
            }
            let Some((r, nodes)) = self.store.rollout(id).await? else {
                return Ok(());
            };
            if !r.state.is_active() {
                return Ok(());
            }
            let flying: Vec<&RolloutNode> = nodes.iter().filter(|n| n.step.in_flight()).collect();
            if !flying.is_empty() {
                let looks =
                    futures::future::join_all(flying.iter().map(|n| self.advance(&r, n, owner)));
                tokio::select! {
                    results = looks => {
                        for res in results {
                            res?;
                        }
                    }
                    _ = lost.cancelled() => return Ok(()),
                    _ = stop.cancelled() => return Ok(()),
                }
            } else if let Some(bad) = nodes
                .iter()
                .find(|n| matches!(n.step, NodeStep::Failed | NodeStep::RolledBack))
            {
                let error = format!(
                    "node {} {}: {}",
                    bad.name,
                    if bad.step == NodeStep::RolledBack {
                        "rolled back"
                    } else {
                        "failed"
                    },
                    bad.seen.as_deref().unwrap_or("")
                );
                let done: Vec<&str> = nodes
                    .iter()
                    .filter(|n| n.step == NodeStep::Done)
                    .map(|n| n.name.as_str())
                    .collect();
                let event = rollout_event(
                    &r,
                    "upgrade.failed",
                    "plinth",
                    serde_json::json!({"error": error, "node": bad.name, "upgraded": done}),
                );
                self.store
                    .end_rollout(id, owner, &failed(error.clone()), &event)
                    .await?;
                tracing::warn!(cluster = %r.cluster, rollout = %id, %error, "upgrade rollout stopped");
                return Ok(());
            } else if r.state == RolloutState::Paused {
                self.store.release_rollout(id, owner).await?;
                return Ok(());
            } else if let Some(batch) = nodes
                .iter()
                .filter(|n| n.step == NodeStep::Pending)
                .map(|n| n.batch)
                .min()
            {
                let members: Vec<&RolloutNode> = nodes
                    .iter()
                    .filter(|n| n.step == NodeStep::Pending && n.batch == batch)
                    .collect();
                if members.iter().any(|n| n.role == Role::ControlPlane) {
                    if let Err(why) = self.etcd_gate(&r.cluster).await {
                        let since = *gate_since.get_or_insert_with(Utc::now);
                        let limit = Duration::seconds(
                            i64::try_from(r.node_timeout_seconds).unwrap_or(i64::MAX),
                        );
                        if Utc::now() - since > limit {
                            let error = format!(
                                "etcd of cluster {} did not have every member healthy within {}s before control plane {} was due: {why}",
                                r.cluster, r.node_timeout_seconds, members[0].name
                            );
                            let event = rollout_event(
                                &r,
                                "upgrade.failed",
                                "plinth",
                                serde_json::json!({"error": error}),
                            );
                            self.store
                                .end_rollout(id, owner, &failed(error.clone()), &event)
                                .await?;
                            return Ok(());
                        }
                        tracing::info!(cluster = %r.cluster, rollout = %id, %why, "upgrade rollout: waiting for etcd before the next control plane");
                        self.pause_for(stop, lost).await;
                        continue;
                    }
                    gate_since = None;
                }
                for n in members {
                    self.start_node(&r, n, owner).await?;
                }
                continue;
            } else {
                self.finish(&r, &nodes, owner).await?;
                return Ok(());
            }
            self.pause_for(stop, lost).await;
        }
    }

    async fn pause_for(&self, stop: &CancellationToken, lost: &CancellationToken) {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = lost.cancelled() => {}
            _ = tokio::time::sleep(self.settings.poll) => {}
        }
    }

    /// Every node done: the cluster's inventory follows, the rollout ends.
    async fn finish(
        &self,
        r: &Rollout,
        nodes: &[RolloutNode],
        owner: &str,
    ) -> Result<(), ServiceError> {
        let spec = self.clusters.spec(&r.cluster).await?;
        let update = ClusterVersionUpdate {
            cluster: r.cluster.clone(),
            talos_version: r.to_version.clone(),
            schematic_id: r.schematic_id.clone(),
            install_image: spec.install_image.as_ref().map(|_| r.installer.clone()),
        };
        let event = rollout_event(
            r,
            "upgrade.done",
            "plinth",
            serde_json::json!({
                "upgraded": nodes.iter().filter(|n| n.step == NodeStep::Done).map(|n| n.name.clone()).collect::<Vec<_>>(),
                "skipped": nodes.iter().filter(|n| n.step == NodeStep::Skipped).map(|n| n.name.clone()).collect::<Vec<_>>(),
                "inventory": {"talosVersion": update.talos_version, "schematicId": update.schematic_id, "installImage": update.install_image},
            }),
        );
        if self
            .store
            .end_rollout(
                r.id,
                owner,
                &RolloutEnd {
                    state: RolloutState::Done,
                    error: None,
                    at: Utc::now(),
                    update: Some(update),
                },
                &event,
            )
            .await?
        {
            tracing::info!(cluster = %r.cluster, rollout = %r.id, to = %r.to_version, "upgrade rollout done; the cluster's inventory follows");
        }
        Ok(())
    }

    /// Every etcd member healthy, with a leader: a control plane may go down now.
    async fn etcd_gate(&self, cluster: &str) -> Result<(), String> {
        let h = self
            .clusters
            .measure(cluster)
            .await
            .map_err(|e| format!("cannot measure: {e}"))?;
        let c = etcd_check(&h);
        if c.passed {
            Ok(())
        } else {
            Err(c.detail)
        }
    }

    async fn node(
        &self,
        r: &Rollout,
        n: &RolloutNode,
        role: &str,
    ) -> Result<super::ports::talos_api::TalosNode, ServiceError> {
        let ip: IpAddr = n.address.parse().map_err(|_| {
            ServiceError::NotFound(format!("an address for node {} (`{}`)", n.name, n.address))
        })?;
        self.clusters.talos_node(&r.cluster, ip, role).await
    }

    /// Start a pending node: read its boot id, then `upgrading` with its deadline.
    async fn start_node(
        &self,
        r: &Rollout,
        n: &RolloutNode,
        owner: &str,
    ) -> Result<(), ServiceError> {
        let admin = self.node(r, n, "os:admin").await?;
        let now = Utc::now();
        let mut next = n.clone();
        next.step = NodeStep::Upgrading;
        next.started_at = Some(now);
        next.deadline = Some(
            now + Duration::seconds(i64::try_from(r.node_timeout_seconds).unwrap_or(i64::MAX)),
        );
        match self.clusters.api().boot_id(&admin).await {
            Ok(b) => {
                next.boot_id = Some(b);
                next.seen = Some(format!(
                    "starting {} with {}",
                    r.installer,
                    call_name(n.method)
                ));
            }
            Err(e) => next.seen = Some(format!("cannot read its boot id yet: {}", e.cause)),
        }
        let event = node_event(
            r,
            &next,
            "upgrade.node_started",
            serde_json::json!({"installer": n.installer, "deadline": next.deadline}),
        );
        self.store
            .advance_node(r.id, owner, &next, NodeStep::Pending, Some(&event))
            .await?;
        Ok(())
    }

    /// Look at a node in flight once and write what changed.
    async fn advance(&self, r: &Rollout, n: &RolloutNode, owner: &str) -> Result<(), ServiceError> {
        let now = Utc::now();
        let mv = if n.deadline.is_some_and(|d| now > d) {
            let text = format!(
                "not verified within its deadline of {}s (at step {}); last seen: {}",
                r.node_timeout_seconds,
                n.step,
                n.seen.as_deref().unwrap_or("nothing")
            );
            self.end_node(r, n, NodeStep::Failed, text, "upgrade.node_failed")
        } else {
            match n.step {
                NodeStep::Upgrading => self.upgrading(r, n).await?,
                NodeStep::Rebooting => self.rebooting(r, n).await?,
                NodeStep::Verifying => self.verifying(r, n).await?,
                _ => Move::Stay,
            }
        };
        if let Move::To(next, event) = mv {
            self.store
                .advance_node(r.id, owner, &next, n.step, event.as_ref())
                .await?;
        }
        Ok(())
    }

    fn end_node(
        &self,
        r: &Rollout,
        n: &RolloutNode,
        step: NodeStep,
        text: String,
        kind: &str,
    ) -> Move {
        let mut next = n.clone();
        next.step = step;
        next.finished_at = Some(Utc::now());
        next.seen = Some(text.clone());
        let event = node_event(
            r,
            &next,
            kind,
            serde_json::json!({"error": text, "at_step": n.step}),
        );
        tracing::warn!(cluster = %r.cluster, node = %n.name, step = %step, %text, "upgrade: node stopped the rollout");
        Move::To(Box::new(next), Some(event))
    }

    fn note(n: &RolloutNode, seen: String) -> Move {
        if n.seen.as_deref() == Some(seen.as_str()) {
            return Move::Stay;
        }
        let mut next = n.clone();
        next.seen = Some(seen);
        Move::To(Box::new(next), None)
    }

    fn to_step(
        r: &Rollout,
        n: &RolloutNode,
        step: NodeStep,
        seen: String,
        kind: &str,
        extra: serde_json::Value,
    ) -> Move {
        let mut next = n.clone();
        next.step = step;
        next.seen = Some(seen);
        if step.succeeded() {
            next.finished_at = Some(Utc::now());
        }
        let event = node_event(r, &next, kind, extra);
        Move::To(Box::new(next), Some(event))
    }

    /// A failed upgrade call: wait (transient, or an upgrade in progress) or stop the rollout.
    fn call_failed(&self, r: &Rollout, n: &RolloutNode, e: TalosApiError) -> Move {
        if transient(&e) {
            return Self::note(n, format!("{}: will ask again", e.cause));
        }
        if e.is_refused(StatusCode::FailedPrecondition) && e.cause.contains("in progress") {
            return Self::note(
                n,
                format!("an upgrade is in progress on the node: {}", e.cause),
            );
        }
        let text = if e.is_refused(StatusCode::Unimplemented) {
            format!(
                "the node does not serve {} (it reported {}): {}",
                e.call, n.from_version, e.cause
            )
        } else {
            format!("the node refused {}: {}", e.call, e.cause)
        };
        self.end_node(r, n, NodeStep::Failed, text, "upgrade.node_failed")
    }

    async fn upgrading(&self, r: &Rollout, n: &RolloutNode) -> Result<Move, ServiceError> {
        let api = self.clusters.api();
        let admin = self.node(r, n, "os:admin").await?;
        let Some(before) = &n.boot_id else {
            return Ok(match api.boot_id(&admin).await {
                Ok(b) => {
                    let mut next = n.clone();
                    next.boot_id = Some(b);
                    next.seen = Some(format!(
                        "starting {} with {}",
                        r.installer,
                        call_name(n.method)
                    ));
                    Move::To(Box::new(next), None)
                }
                Err(e) => Self::note(n, format!("cannot read its boot id yet: {}", e.cause)),
            });
        };
        // A call whose answer was lost (Plinth restarted, the connection broke) may have gone
        // through: a node that booted since is not called again.
        match api.boot_id(&admin).await {
            Ok(b) if &b != before => {
                return Ok(Self::to_step(
                    r,
                    n,
                    NodeStep::Verifying,
                    "booted again (new boot id) after an upgrade call whose answer Plinth did not record".into(),
                    "upgrade.node_rebooted",
                    serde_json::json!({"boot_id": b}),
                ))
            }
            Ok(_) => {}
            Err(e) => {
                return Ok(Self::note(
                    n,
                    format!("Talos API not answering before the call: {}", e.cause),
                ))
            }
        }
        match n.method {
            UpgradeMethod::Machine => match api.upgrade_legacy(&admin, &n.installer).await {
                Ok(ack) => Ok(Self::to_step(
                    r,
                    n,
                    NodeStep::Rebooting,
                    format!("MachineService.Upgrade acknowledged ({ack}): the node installs and reboots"),
                    "upgrade.node_called",
                    serde_json::json!({"call": "MachineService.Upgrade", "ack": ack}),
                )),
                Err(e) => Ok(self.call_failed(r, n, e)),
            },
            UpgradeMethod::Lifecycle => {
                let name = match api
                    .pull_image(&admin, &n.installer, self.settings.install_wait)
                    .await
                {
                    Ok(name) => name,
                    Err(e) => return Ok(self.call_failed(r, n, e)),
                };
                // As talosctl does: the installer is named as it was pulled by reference.
                match api
                    .lifecycle_upgrade(&admin, &n.installer, self.settings.install_wait)
                    .await
                {
                    Ok(o) if o.exit_code == 0 => {}
                    Ok(o) => {
                        return Ok(self.end_node(
                            r,
                            n,
                            NodeStep::Failed,
                            format!(
                                "the installer exited with code {} (nothing was rebooted): {}",
                                o.exit_code,
                                o.messages.join(" | ")
                            ),
                            "upgrade.node_failed",
                        ))
                    }
                    Err(e) => return Ok(self.call_failed(r, n, e)),
                }
                match api.reboot(&admin).await {
                    Ok(()) => Ok(Self::to_step(
                        r,
                        n,
                        NodeStep::Rebooting,
                        format!("pulled {name}, installed it into the other boot slot; reboot requested"),
                        "upgrade.node_called",
                        serde_json::json!({"call": "LifecycleService.Upgrade", "image": name}),
                    )),
                    Err(e) => Ok(self.call_failed(r, n, e)),
                }
            }
        }
    }

    async fn rebooting(&self, r: &Rollout, n: &RolloutNode) -> Result<Move, ServiceError> {
        let admin = self.node(r, n, "os:admin").await?;
        Ok(match self.clusters.api().boot_id(&admin).await {
            Ok(b) if Some(&b) != n.boot_id.as_ref() => Self::to_step(
                r,
                n,
                NodeStep::Verifying,
                "booted again (new boot id)".into(),
                "upgrade.node_rebooted",
                serde_json::json!({"boot_id": b}),
            ),
            Ok(_) => Self::note(n, "not rebooted yet (same boot id)".into()),
            Err(e) => Self::note(
                n,
                format!("Talos API not answering (rebooting?): {}", e.cause),
            ),
        })
    }

    async fn verifying(&self, r: &Rollout, n: &RolloutNode) -> Result<Move, ServiceError> {
        let api = self.clusters.api();
        let reader = self.node(r, n, "os:reader").await?;
        let v = match api.version(&reader).await {
            Ok(v) => v,
            Err(e) => return Ok(Self::note(n, format!("Talos API: {}", e.cause))),
        };
        if v.tag != r.to_version {
            return Ok(if v.tag == n.from_version {
                self.end_node(
                    r,
                    n,
                    NodeStep::RolledBack,
                    format!(
                        "booted again on {}, not {}: Talos' A/B fallback booted the previous version (the new one did not come up)",
                        v.tag, r.to_version
                    ),
                    "upgrade.node_rolled_back",
                )
            } else {
                self.end_node(
                    r,
                    n,
                    NodeStep::Failed,
                    format!(
                        "booted again on {}: neither {} nor its previous {}",
                        v.tag, r.to_version, n.from_version
                    ),
                    "upgrade.node_failed",
                )
            });
        }
        let mut problems = match api.services(&reader).await {
            Ok(s) => service_problems(n.role, &s),
            Err(e) => vec![format!("services: {}", e.cause)],
        };
        let mut etcd = String::new();
        if n.role == Role::ControlPlane {
            match api.etcd_members(&reader).await {
                Ok(members) => match members.iter().find(|m| m.hostname == n.name) {
                    None => problems.push(format!(
                        "not an etcd member (members: {})",
                        members
                            .iter()
                            .map(|m| m.hostname.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                    Some(m) if m.is_learner => problems.push("still an etcd learner".into()),
                    Some(_) => {}
                },
                Err(e) => problems.push(format!("etcd members: {}", e.cause)),
            }
            match api.etcd_status(&reader).await {
                Ok(s) if s.leader == 0 => problems.push("its etcd sees no leader".into()),
                Ok(s) if !s.errors.is_empty() => {
                    problems.push(format!("etcd reports {}", s.errors.join(", ")))
                }
                Ok(s) => {
                    etcd = format!(
                        ", etcd member {:x} healthy (leader {:x})",
                        s.member_id, s.leader
                    )
                }
                Err(e) => problems.push(format!("etcd status: {}", e.cause)),
            }
        }
        if !problems.is_empty() {
            return Ok(Self::note(
                n,
                format!("runs {}; waiting: {}", v.tag, problems.join("; ")),
            ));
        }
        self.clusters
            .record_upgraded(&r.cluster, n.machine_id, &n.address, &v)
            .await?;
        Ok(Self::to_step(
            r,
            n,
            NodeStep::Done,
            format!(
                "runs {}; {} running and healthy{etcd}",
                v.tag,
                required_services(n.role).join(", ")
            ),
            "upgrade.node_done",
            serde_json::json!({"version": v.tag, "cert_sha256": v.cert_sha256}),
        ))
    }
}

/// The end of a failed rollout.
fn failed(error: String) -> RolloutEnd {
    RolloutEnd {
        state: RolloutState::Failed,
        error: Some(error),
        at: Utc::now(),
        update: None,
    }
}

fn call_name(m: UpgradeMethod) -> &'static str {
    match m {
        UpgradeMethod::Machine => "MachineService.Upgrade",
        UpgradeMethod::Lifecycle => {
            "ImageService.Pull, LifecycleService.Upgrade, MachineService.Reboot"
        }
    }
}

/// Every node installed, its Talos API up, its services running and healthy, Talos' own check.
fn nodes_check(h: &ClusterHealth) -> PreCheck {
    let mut problems = Vec::new();
    for n in &h.nodes {
        let role = n.role.unwrap_or(Role::Worker);
        if n.state != LifecycleState::Installed {
            problems.push(format!("{} is {}", n.machine, n.state));
            continue;
        }
        if !n.apid {
            problems.push(format!(
                "{}: Talos API: {}",
                n.machine,
                n.error.as_deref().unwrap_or("no answer")
            ));
            continue;
        }
        let p = service_problems(role, &n.services);
        if !p.is_empty() {
            problems.push(format!("{}: {}", n.machine, p.join(", ")));
        }
    }
    if problems.is_empty() {
        if let Some(c) = h.talos_check.as_ref().filter(|c| !c.passed) {
            problems.push(format!(
                "Talos' cluster health check did not pass: {}",
                c.error.as_deref().unwrap_or("")
            ));
        }
    }
    PreCheck {
        name: "nodes healthy".into(),
        passed: problems.is_empty() && !h.nodes.is_empty(),
        detail: if problems.is_empty() {
            format!("{} node(s) up, services running and healthy", h.nodes.len())
        } else {
            problems.join("; ")
        },
    }
}

/// etcd with every member healthy and a leader (and not two members).
fn etcd_check(h: &ClusterHealth) -> PreCheck {
    let verdict = match &h.etcd {
        None => Err(
            "no control plane answers with a running etcd (is the cluster bootstrapped?)"
                .to_string(),
        ),
        Some(e) => {
            let total = e.members.len() as u32;
            let learners: Vec<&str> = e
                .members
                .iter()
                .filter(|m| m.is_learner)
                .map(|m| m.hostname.as_str())
                .collect();
            if e.healthy_members < total {
                Err(format!(
                    "{} of {total} members healthy: every member must be healthy so that one control plane can go down",
                    e.healthy_members
                ))
            } else if total == 2 {
                Err("two members: taking one down loses quorum (Talos refuses too); add a third control plane first".into())
            } else if e.leader.is_none() {
                Err("no member knows a leader".into())
            } else if !learners.is_empty() {
                Err(format!("learners still joining: {}", learners.join(", ")))
            } else {
                Ok(format!(
                    "{total} of {total} members healthy, leader {}",
                    e.leader_hostname.as_deref().unwrap_or("?")
                ))
            }
        }
    };
    PreCheck {
        name: "etcd quorum".into(),
        passed: verdict.is_ok(),
        detail: verdict.unwrap_or_else(|e| e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_call_follows_the_version() {
        for (tag, m) in [
            ("v1.11.6", UpgradeMethod::Machine),
            ("v1.12.11", UpgradeMethod::Machine),
            ("v1.13.0-alpha.2", UpgradeMethod::Machine),
            ("v1.13.0-alpha.3", UpgradeMethod::Lifecycle),
            ("v1.13.0", UpgradeMethod::Lifecycle),
            ("v1.13.9", UpgradeMethod::Lifecycle),
            ("v1.14.0-beta.1", UpgradeMethod::Lifecycle),
            ("garbage", UpgradeMethod::Machine),
        ] {
            assert_eq!(method_for(tag), m, "{tag}");
        }
    }

    #[test]
    fn only_adjacent_minor_releases_and_never_down() {
        let to = |s: &str| s.parse::<TalosVersion>().expect("version");
        assert_eq!(path_problem("v1.12.11", to("v1.13.9"), "v1.13.9"), None);
        assert_eq!(path_problem("v1.13.2", to("v1.13.9"), "v1.13.9"), None);
        let skip = path_problem("v1.11.6", to("v1.13.9"), "v1.13.9").expect("skip");
        assert!(
            skip.contains("skips a minor release") && skip.contains("v1.12.x"),
            "{skip}"
        );
        let down = path_problem("v1.13.9", to("v1.13.2"), "v1.13.2").expect("down");
        assert!(down.contains("downgrade"), "{down}");
        assert!(path_problem("v1.13.9", to("v2.0.0"), "v2.0.0").is_some());
    }

    #[test]
    fn a_declared_mirror_is_retagged() {
        assert_eq!(
            retag("registry.lab:5000/siderolabs/installer:v1.12.11", "v1.13.9").as_deref(),
            Ok("registry.lab:5000/siderolabs/installer:v1.13.9")
        );
        assert_eq!(
            retag("registry.lab:5000/installer", "v1.13.9").as_deref(),
            Ok("registry.lab:5000/installer:v1.13.9")
        );
        assert!(retag("r.lab/installer@sha256:abcd", "v1.13.9").is_err());
    }
}

//! etcd snapshots and recovery (#20): taking a cluster's snapshot now or on its schedule, keeping
//! as many as its policy says, and restoring one onto a control plane when the cluster lost its
//! etcd majority.
//!
//! Taking one: the cluster's turn is claimed in the database (one instance at a time when several
//! share PostgreSQL; renewed by a task of its own while the snapshot streams, so its length does
//! not matter; rows an instance that died left `taking` are failed and cleaned up by the next
//! holder, and at start) and a row is written (`taking`) before the node is asked. The snapshot is
//! streamed from a control plane whose etcd runs and is healthy (`EtcdSnapshot`, with the
//! least role that may: `os:etcd:backup`), checked as it passes (size, SHA-256, etcd's own
//! trailing SHA-256, the revision in its database: `talos::etcd_db`), encrypted as it passes
//! (`sealed_stream`: XChaCha20-Poly1305 STREAM under a key derived from Plinth's secret key for
//! this cluster, each chunk bound to the cluster and the snapshot's id) and uploaded as it passes
//! (multipart, bounded parts): nothing holds the snapshot whole. A small JSON beside it records
//! what it is (cluster, versions, nodes, revision, hash, how it is sealed; no secret), so a store
//! outlives the database that indexed it. It is then read back, decrypted and hashed: only a
//! snapshot whose bytes match what the node streamed is `verified`. Retention runs only after
//! that, removing the oldest verified snapshots beyond `keep` and the leftovers of failed ones.
//! A failure is a `failed` row, an event, a log line and `plinth_etcd_snapshot_failures_total`;
//! `plinth_etcd_snapshot_age_seconds` is the age of each cluster's newest verified snapshot.
//!
//! Recovery: the documented Talos procedure for a control plane that lost its majority. Refused
//! while etcd still has quorum unless forced with the cluster's name typed as confirmation; then
//! the cluster's one recovery is claimed (a row keyed by the cluster: the one permitted
//! re-bootstrap), the snapshot is decrypted as it streams to one control plane whose etcd waits
//! for a bootstrap (`EtcdRecover`, `os:admin`), that node bootstraps from it (`Bootstrap` with
//! `recover_etcd`), and the other control planes join it on their own; Plinth records which did.
//!
//! Imports `domain`, `talos` (the snapshot check) and the rest of `service`; nothing from `store`,
//! `objects`, `http` or `talos_api`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use chrono::{DateTime, Duration, Utc};
use futures::StreamExt as _;
use serde::Serialize;
use uuid::Uuid;

use super::clusters::{ClusterLabel, Clusters};
use super::ports::snapshots::{
    ByteStream, ObjectBucket, ObjectError, ObjectStores, RecoveryRecord, RecoveryState,
    SnapshotOutcome, SnapshotRecord, SnapshotState, SnapshotStore,
};
use super::ports::talos_api::{
    BootstrapOptions, StatusCode, TalosApiError, TalosApiFailure, TalosNode,
};
use super::ports::{EventStore, NewEvent};
use super::sealed_stream::{Opener, Sealer};
use super::{SecretBox, ServiceError};
use crate::domain::snapshots::SnapshotPolicy;
use crate::domain::{LifecycleState, Machine, Role};
use crate::talos::etcd_db::{SnapshotCheck, StreamDigest};

/// Knobs of the snapshot use cases.
#[derive(Clone, Debug)]
pub struct SnapshotSettings {
    /// This instance's name (recorded with each snapshot, and holding the turn).
    pub instance: String,
    /// How long a turn to take a snapshot lasts without renewal (`[snapshots] turn_seconds`):
    /// the holder renews it every third of this in a task of its own while it streams; an
    /// instance that died loses it then, and the rows it left `taking` are marked failed by the
    /// next holder.
    pub turn: Duration,
    /// After a failed attempt, the schedule tries again after this long.
    pub retry_after: Duration,
    /// How long a recovery waits for the other control planes to rejoin.
    pub rejoin_wait: std::time::Duration,
    /// Pause between looks while waiting.
    pub poll: std::time::Duration,
}

impl Default for SnapshotSettings {
    fn default() -> Self {
        SnapshotSettings {
            instance: super::clusters::default_instance(),
            turn: Duration::seconds(60),
            retry_after: Duration::minutes(5),
            rejoin_wait: std::time::Duration::from_secs(600),
            poll: std::time::Duration::from_secs(5),
        }
    }
}

/// Why a snapshot was not taken, or was taken and failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// No policy, no healthy control plane, ...: nothing was recorded.
    #[error("{0}")]
    NotPossible(String),
    /// Another instance (or another request) is taking this cluster's snapshot.
    #[error("{0}")]
    Busy(String),
    /// Recorded as failed (an event and a metric).
    #[error("snapshot {id} of cluster {cluster} failed: {cause}")]
    Failed {
        /// The snapshot.
        id: Uuid,
        /// The cluster.
        cluster: String,
        /// Why.
        cause: String,
    },
    /// Store, secrets, configs.
    #[error(transparent)]
    Service(#[from] ServiceError),
}

/// Why a recovery was not made.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// etcd still has quorum and the recovery was not forced with the typed confirmation.
    #[error("{0}")]
    QuorumHeld(String),
    /// The cluster's one recovery was already claimed.
    #[error("cluster {} was already recovered from snapshot {} on {} at {} ({}); a cluster is recovered from a snapshot once", .0.cluster, .0.snapshot_id, .0.node, .0.claimed_at.to_rfc3339(), .0.state.as_str())]
    Already(Box<RecoveryRecord>),
    /// Not possible as asked (no such snapshot, no suitable node, ...): nothing was done.
    #[error("{0}")]
    NotPossible(String),
    /// It failed after the claim.
    #[error("recovery of cluster {cluster} failed: {cause}")]
    Failed {
        /// The cluster.
        cluster: String,
        /// Why.
        cause: String,
    },
    /// Store, secrets, configs.
    #[error(transparent)]
    Service(#[from] ServiceError),
}

/// A recovery request.
#[derive(Clone, Debug, Default)]
pub struct RecoverRequest {
    /// The snapshot.
    pub snapshot: Uuid,
    /// The control plane to restore on (host name, id or address); default: the first that
    /// waits for a bootstrap.
    pub node: Option<String>,
    /// Go ahead although etcd has quorum...
    pub force: bool,
    /// ...when this is the cluster's name, typed.
    pub confirm: Option<String>,
}

/// The rolling upgrade's pre-check reads the newest verified snapshot here, and a rollout whose
/// newest is stale takes one here.
#[async_trait::async_trait]
impl super::upgrade::SnapshotCheck for Snapshots {
    async fn latest_verified(
        &self,
        cluster: &str,
    ) -> Result<Option<super::upgrade::VerifiedSnapshot>, ServiceError> {
        Ok(Snapshots::latest_verified(self, cluster)
            .await?
            .as_ref()
            .map(verified_snapshot))
    }

    async fn take_verified(
        &self,
        cluster: &str,
        actor: &str,
    ) -> Result<super::upgrade::VerifiedSnapshot, String> {
        self.take(cluster, actor)
            .await
            .map(|r| verified_snapshot(&r))
            .map_err(|e| e.to_string())
    }
}

fn verified_snapshot(r: &SnapshotRecord) -> super::upgrade::VerifiedSnapshot {
    super::upgrade::VerifiedSnapshot {
        id: r.id.to_string(),
        taken_at: r.started_at,
        verified_at: r.verified_at,
        revision: r.revision,
        store: Some(r.store.clone()),
    }
}

/// Why a snapshot whose turn was lost is abandoned.
const LOST_TURN: &str = "this Plinth instance lost the cluster's snapshot turn (it could not be renewed): the snapshot is abandoned";

/// This process's mark that it takes `cluster`'s snapshot; removed on drop.
struct TakingGuard {
    set: Arc<Mutex<std::collections::HashSet<String>>>,
    cluster: String,
}

impl TakingGuard {
    fn new(set: &Arc<Mutex<std::collections::HashSet<String>>>, cluster: &str) -> Option<Self> {
        let mut s = set.lock().ok()?;
        s.insert(cluster.to_string()).then(|| TakingGuard {
            set: set.clone(),
            cluster: cluster.to_string(),
        })
    }
}

impl Drop for TakingGuard {
    fn drop(&mut self) {
        if let Ok(mut s) = self.set.lock() {
            s.remove(&self.cluster);
        }
    }
}

/// How a restore failed.
enum Restore {
    /// Before anything reached the node's etcd (the upload, or a bootstrap the node refused).
    NothingChanged(String),
    /// The bootstrap may have run.
    Unknown(String),
}

/// The sidecar object beside each snapshot: what it is, without a secret.
#[derive(Serialize)]
struct Sidecar<'a> {
    format: &'static str,
    encryption: String,
    #[serde(flatten)]
    record: &'a SnapshotRecord,
}

type AgeMap = BTreeMap<String, DateTime<Utc>>;

/// `plinth_etcd_snapshot_age_seconds`: computed when scraped, from the time of each cluster's
/// newest verified snapshot (or, before its first, from when this instance first saw its policy).
#[derive(Clone, Debug, Default)]
struct SnapshotAges(Arc<Mutex<AgeMap>>);

impl prometheus_client::encoding::EncodeMetric for SnapshotAges {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        let now = Utc::now();
        let ages: Vec<(String, f64)> = self
            .0
            .lock()
            .map(|m| {
                m.iter()
                    .map(|(c, at)| {
                        (
                            c.clone(),
                            (now - *at).num_milliseconds().max(0) as f64 / 1000.0,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (cluster, age) in ages {
            let label = ClusterLabel { cluster };
            encoder.encode_family(&label)?.encode_gauge(&age)?;
        }
        Ok(())
    }
    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Gauge
    }
}

type FailureCounter = prometheus_client::metrics::family::Family<
    ClusterLabel,
    prometheus_client::metrics::counter::Counter,
>;

/// The snapshot and recovery use cases.
#[derive(Clone)]
pub struct Snapshots {
    clusters: Clusters,
    store: Arc<dyn SnapshotStore>,
    events: Arc<dyn EventStore>,
    objects: Arc<dyn ObjectStores>,
    secrets: SecretBox,
    settings: SnapshotSettings,
    /// The newest verified snapshot's time per cluster (for the gauge).
    ages: SnapshotAges,
    failures: FailureCounter,
    /// Clusters this process is taking a snapshot of (the database's turn lets the same
    /// instance claim again, so two requests to one instance are kept apart here).
    taking: Arc<Mutex<std::collections::HashSet<String>>>,
}

/// Renew `cluster`'s snapshot turn every third of `turn` until `done`; cancel `lost` when the
/// turn is lost (another instance holds it) or could not be renewed before it expired. Runs as
/// a task of its own, so a snapshot that streams for longer than the turn keeps it whatever the
/// stream does.
async fn hold_turn(
    store: Arc<dyn SnapshotStore>,
    cluster: String,
    instance: String,
    turn: Duration,
    lost: tokio_util::sync::CancellationToken,
    done: tokio_util::sync::CancellationToken,
) {
    let every = (turn / 3)
        .to_std()
        .unwrap_or(std::time::Duration::from_secs(20))
        .max(std::time::Duration::from_millis(100));
    let mut expires = Utc::now() + turn;
    loop {
        tokio::select! {
            () = done.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let now = Utc::now();
        match store
            .take_snapshot_turn(&cluster, &instance, now, now + turn)
            .await
        {
            Ok(true) => expires = now + turn,
            Ok(false) => {
                tracing::error!(
                    cluster,
                    "etcd snapshot: another instance took the turn; abandoning the snapshot"
                );
                lost.cancel();
                return;
            }
            Err(e) if Utc::now() >= expires => {
                tracing::error!(cluster, error = %e, "etcd snapshot: the turn could not be renewed before it expired; abandoning the snapshot");
                lost.cancel();
                return;
            }
            Err(e) => {
                tracing::warn!(cluster, error = %e, "etcd snapshot: cannot renew the turn yet; trying again");
            }
        }
    }
}

fn event(kind: &str, actor: &str, detail: serde_json::Value) -> NewEvent {
    NewEvent {
        machine_id: None,
        kind: kind.into(),
        actor: actor.into(),
        detail,
    }
}

/// The key's purpose and the chunks' associated data.
fn key_purpose(cluster: &str) -> String {
    format!("etcd-snapshot:{cluster}")
}
fn chunk_purpose(cluster: &str, id: Uuid) -> String {
    format!("etcd-snapshot:{cluster}:{id}")
}

fn obj_err(e: ObjectError) -> String {
    e.to_string()
}

/// A control plane to talk to.
struct ControlPlane {
    machine: Machine,
    ip: IpAddr,
}

/// What the control planes' etcd looks like now.
struct EtcdView {
    /// Members as the first answering member lists them.
    members: Vec<String>,
    /// Control planes whose etcd runs, is healthy and answers its status.
    healthy: Vec<String>,
}

impl EtcdView {
    fn quorum_held(&self) -> bool {
        !self.members.is_empty() && self.healthy.len() > self.members.len() / 2
    }
}

impl Snapshots {
    /// Over the cluster use cases (nodes, credentials, the Talos API), the snapshot store, the
    /// event log, the object stores and Plinth's secret key.
    pub fn new(
        clusters: Clusters,
        store: Arc<dyn SnapshotStore>,
        events: Arc<dyn EventStore>,
        objects: Arc<dyn ObjectStores>,
        secrets: SecretBox,
        settings: SnapshotSettings,
    ) -> Self {
        Snapshots {
            clusters,
            store,
            events,
            objects,
            secrets,
            settings,
            ages: SnapshotAges::default(),
            failures: FailureCounter::default(),
            taking: Arc::default(),
        }
    }

    /// Register `plinth_etcd_snapshot_age_seconds` and `plinth_etcd_snapshot_failures_total`.
    pub fn register_metrics(&self, metrics: &crate::metrics::Metrics) {
        metrics.register(
            "etcd_snapshot_age_seconds",
            "Age of the cluster's newest verified etcd snapshot (before its first: since Plinth saw its policy)",
            self.ages.clone(),
        );
        metrics.register(
            "etcd_snapshot_failures",
            "etcd snapshots of the cluster that failed",
            self.failures.clone(),
        );
    }

    /// The settings.
    pub fn settings(&self) -> &SnapshotSettings {
        &self.settings
    }

    /// A cluster's snapshots, newest first.
    pub async fn list(
        &self,
        cluster: &str,
        limit: u32,
    ) -> Result<Vec<SnapshotRecord>, ServiceError> {
        self.clusters.spec(cluster).await?;
        Ok(self.store.snapshots(cluster, limit.clamp(1, 1000)).await?)
    }

    /// One snapshot of `cluster`.
    pub async fn get(&self, cluster: &str, id: Uuid) -> Result<SnapshotRecord, ServiceError> {
        match self.store.snapshot(id).await? {
            Some(r) if r.cluster == cluster => Ok(r),
            _ => Err(ServiceError::NotFound(format!(
                "snapshot {id} of cluster {cluster}"
            ))),
        }
    }

    /// The newest snapshot of `cluster` that was stored and verified (read back, decrypted, its
    /// size and SHA-256 equal to what the node streamed, etcd's trailer and revision checked).
    pub async fn latest_verified(
        &self,
        cluster: &str,
    ) -> Result<Option<SnapshotRecord>, ServiceError> {
        // Verified snapshots are never more than `keep` (at most 10000) plus the ones being
        // taken; failed ones interleave, so look further than that.
        let mut limit = 64;
        loop {
            let list = self.store.snapshots(cluster, limit).await?;
            if let Some(r) = list.iter().find(|r| r.state == SnapshotState::Verified) {
                return Ok(Some(r.clone()));
            }
            if (list.len() as u32) < limit || limit >= 20_000 {
                return Ok(None);
            }
            limit *= 4;
        }
    }

    /// A cluster's recovery, if one was made.
    pub async fn recovery(&self, cluster: &str) -> Result<Option<RecoveryRecord>, ServiceError> {
        Ok(self.store.recovery(cluster).await?)
    }

    async fn policy(&self, cluster: &str) -> Result<SnapshotPolicy, SnapshotError> {
        let spec = self.clusters.spec(cluster).await?;
        spec.etcd_snapshots.ok_or_else(|| {
            SnapshotError::NotPossible(format!(
                "cluster {cluster} declares no etcdSnapshots: add `etcdSnapshots: {{every: 6h, keep: 28, store: s3://BUCKET/PREFIX}}` to its Cluster document and apply it"
            ))
        })
    }

    async fn control_planes(&self, cluster: &str) -> Result<Vec<ControlPlane>, ServiceError> {
        let mut out: Vec<ControlPlane> = self
            .clusters
            .cluster_nodes(cluster)
            .await?
            .into_iter()
            .filter(|(m, _)| {
                m.role == Some(Role::ControlPlane) && m.state == LifecycleState::Installed
            })
            .filter_map(|(m, ip)| ip.map(|ip| ControlPlane { machine: m, ip }))
            .collect();
        out.sort_by_key(|c| c.machine.display_name());
        Ok(out)
    }

    /// Whether a control plane's etcd runs and is healthy (`ServiceList`, then `EtcdStatus`).
    async fn etcd_healthy(&self, node: &TalosNode) -> bool {
        let Ok(services) = self.clusters.api().services(node).await else {
            return false;
        };
        let running = services
            .iter()
            .any(|s| s.id == "etcd" && s.state == "Running" && s.healthy == Some(true));
        running && self.clusters.api().etcd_status(node).await.is_ok()
    }

    async fn etcd_view(
        &self,
        cluster: &str,
        cps: &[ControlPlane],
    ) -> Result<EtcdView, ServiceError> {
        let mut view = EtcdView {
            members: Vec::new(),
            healthy: Vec::new(),
        };
        for cp in cps {
            let node = self
                .clusters
                .talos_node(cluster, cp.ip, "os:reader")
                .await?;
            if self.etcd_healthy(&node).await {
                view.healthy.push(cp.machine.display_name());
                if view.members.is_empty() {
                    if let Ok(m) = self.clusters.api().etcd_members(&node).await {
                        view.members = m.into_iter().map(|m| m.hostname).collect();
                    }
                }
            }
        }
        Ok(view)
    }

    /// Take a snapshot of `cluster` now (`plinth cluster snapshot`, the schedule), store it,
    /// verify it, then apply retention.
    pub async fn take(&self, cluster: &str, actor: &str) -> Result<SnapshotRecord, SnapshotError> {
        self.take_notify(cluster, actor, None).await
    }

    /// `take`, sending the snapshot's id on `started` once its row is written (the HTTP API
    /// answers 202 with it when the snapshot takes longer than the caller waits).
    pub async fn take_notify(
        &self,
        cluster: &str,
        actor: &str,
        started: Option<tokio::sync::oneshot::Sender<Uuid>>,
    ) -> Result<SnapshotRecord, SnapshotError> {
        let policy = self.policy(cluster).await?;
        let bucket = self
            .objects
            .open(&policy.store)
            .map_err(|e| SnapshotError::NotPossible(obj_err(e)))?;
        let busy = || {
            SnapshotError::Busy(format!(
                "a snapshot of cluster {cluster} is being taken (by this or another Plinth instance); try again when it is done"
            ))
        };
        let Some(_mine) = TakingGuard::new(&self.taking, cluster) else {
            return Err(busy());
        };
        let now = Utc::now();
        if !self
            .store
            .take_snapshot_turn(
                cluster,
                &self.settings.instance,
                now,
                now + self.settings.turn,
            )
            .await
            .map_err(ServiceError::from)?
        {
            return Err(busy());
        }
        let (lost, done) = (
            tokio_util::sync::CancellationToken::new(),
            tokio_util::sync::CancellationToken::new(),
        );
        let holder = tokio::spawn(hold_turn(
            self.store.clone(),
            cluster.to_string(),
            self.settings.instance.clone(),
            self.settings.turn,
            lost.clone(),
            done.clone(),
        ));
        let result = self
            .take_with_turn(cluster, actor, &policy, bucket, &lost, started)
            .await;
        done.cancel();
        let _ = holder.await;
        if let Err(e) = self
            .store
            .release_snapshot_turn(cluster, &self.settings.instance)
            .await
        {
            tracing::warn!(cluster, error = %e, "cannot give the snapshot turn back (it expires on its own)");
        }
        result
    }

    async fn take_with_turn(
        &self,
        cluster: &str,
        actor: &str,
        policy: &SnapshotPolicy,
        bucket: Arc<dyn ObjectBucket>,
        lost: &tokio_util::sync::CancellationToken,
        notify: Option<tokio::sync::oneshot::Sender<Uuid>>,
    ) -> Result<SnapshotRecord, SnapshotError> {
        self.fail_interrupted(cluster).await?;
        let spec = self.clusters.spec(cluster).await?;
        let all = self.clusters.cluster_nodes(cluster).await?;
        let mut nodes: Vec<String> = all.iter().map(|(m, _)| m.display_name()).collect();
        nodes.sort();
        let cps = self.control_planes(cluster).await?;
        // A healthy control plane: etcd running and healthy, answering its status.
        let mut source = None;
        let mut seen = Vec::new();
        for cp in &cps {
            let node = self
                .clusters
                .talos_node(cluster, cp.ip, "os:etcd:backup")
                .await?;
            let reader = self
                .clusters
                .talos_node(cluster, cp.ip, "os:reader")
                .await?;
            if !self.etcd_healthy(&reader).await {
                seen.push(format!(
                    "{}: etcd not running and healthy",
                    cp.machine.display_name()
                ));
                continue;
            }
            match self.clusters.api().version(&reader).await {
                Ok(v) => {
                    source = Some((cp, node, v.tag));
                    break;
                }
                Err(e) => seen.push(format!("{}: {}", cp.machine.display_name(), e.cause)),
            }
        }
        let Some((cp, node, talos_version)) = source else {
            return Err(SnapshotError::NotPossible(format!(
                "cluster {cluster} has no control plane with healthy etcd to take a snapshot from{}",
                if seen.is_empty() {
                    " (no installed control plane with a known address)".to_string()
                } else {
                    format!(": {}", seen.join("; "))
                }
            )));
        };
        let id = Uuid::now_v7();
        let started = Utc::now();
        let object = format!(
            "{cluster}/{}-{id}.etcd.sealed",
            started.format("%Y%m%dT%H%M%SZ")
        );
        let mut rec = SnapshotRecord {
            id,
            cluster: cluster.to_string(),
            state: SnapshotState::Taking,
            store: bucket.url().to_string(),
            object: object.clone(),
            instance: self.settings.instance.clone(),
            requested_by: actor.to_string(),
            started_at: started,
            finished_at: None,
            verified_at: None,
            taken_from: Some(cp.machine.display_name()),
            taken_from_address: Some(cp.ip.to_string()),
            talos_version: Some(talos_version),
            kubernetes_version: spec.kubernetes_version.clone(),
            nodes,
            size_bytes: None,
            stored_bytes: None,
            sha256: None,
            revision: None,
            key_fingerprint: Some(self.secrets.fingerprint().to_string()),
            error: None,
        };
        self.store
            .insert_snapshot(
                &rec,
                &event(
                    "cluster.snapshot_started",
                    actor,
                    serde_json::json!({"cluster": cluster, "snapshot": id, "node": rec.taken_from, "store": rec.store, "object": object}),
                ),
            )
            .await
            .map_err(ServiceError::from)?;
        tracing::info!(cluster, snapshot = %id, node = ?rec.taken_from, store = %rec.store, "etcd snapshot: streaming");
        if let Some(tx) = notify {
            let _ = tx.send(id);
        }
        match self
            .stream_store_verify(&mut rec, &node, bucket.as_ref(), lost)
            .await
        {
            Ok(()) => {
                let at = Utc::now();
                let outcome = SnapshotOutcome {
                    state: SnapshotState::Verified,
                    at,
                    size_bytes: rec.size_bytes,
                    stored_bytes: rec.stored_bytes,
                    sha256: rec.sha256.clone(),
                    revision: rec.revision,
                    error: None,
                };
                let recorded = self
                    .store
                    .finish_snapshot(
                        id,
                        &outcome,
                        &event(
                            "cluster.snapshot_verified",
                            actor,
                            serde_json::json!({"cluster": cluster, "snapshot": id, "node": rec.taken_from,
                                "size_bytes": rec.size_bytes, "sha256": rec.sha256, "revision": rec.revision,
                                "store": rec.store, "object": rec.object}),
                        ),
                    )
                    .await
                    .map_err(ServiceError::from)?;
                if !recorded {
                    // Another holder of the turn found the row `taking` and failed it.
                    return Err(SnapshotError::Failed {
                        id,
                        cluster: cluster.to_string(),
                        cause: LOST_TURN.into(),
                    });
                }
                rec.state = SnapshotState::Verified;
                rec.finished_at = Some(at);
                rec.verified_at = Some(at);
                if let Ok(mut ages) = self.ages.0.lock() {
                    ages.insert(cluster.to_string(), rec.started_at);
                }
                tracing::info!(cluster, snapshot = %id, size = ?rec.size_bytes, revision = ?rec.revision, "etcd snapshot verified");
                self.retain(cluster, policy, bucket.as_ref(), &rec, actor)
                    .await;
                Ok(rec)
            }
            Err(cause) => {
                self.fail(&rec, &cause, actor).await?;
                let _ = bucket.delete(&object).await;
                let _ = bucket.delete(&format!("{object}.json")).await;
                Err(SnapshotError::Failed {
                    id,
                    cluster: cluster.to_string(),
                    cause,
                })
            }
        }
    }

    async fn fail(
        &self,
        rec: &SnapshotRecord,
        cause: &str,
        actor: &str,
    ) -> Result<(), ServiceError> {
        let outcome = SnapshotOutcome {
            state: SnapshotState::Failed,
            at: Utc::now(),
            size_bytes: rec.size_bytes,
            stored_bytes: rec.stored_bytes,
            sha256: rec.sha256.clone(),
            revision: rec.revision,
            error: Some(cause.to_string()),
        };
        self.store
            .finish_snapshot(
                rec.id,
                &outcome,
                &event(
                    "cluster.snapshot_failed",
                    actor,
                    serde_json::json!({"cluster": rec.cluster, "snapshot": rec.id, "node": rec.taken_from, "error": cause}),
                ),
            )
            .await?;
        self.failures
            .get_or_create(&ClusterLabel {
                cluster: rec.cluster.clone(),
            })
            .inc();
        tracing::error!(cluster = %rec.cluster, snapshot = %rec.id, error = %cause, "etcd snapshot failed");
        Ok(())
    }

    /// Rows left `taking` by an instance that stopped: failed, and what they left in their store
    /// removed. Called with the cluster's turn held, so no `taking` row is anyone's work in
    /// progress (a holder that loses its turn abandons its snapshot).
    async fn fail_interrupted(&self, cluster: &str) -> Result<(), ServiceError> {
        for r in self.store.snapshots(cluster, 1000).await? {
            if r.state != SnapshotState::Taking {
                continue;
            }
            self.fail(
                &r,
                &format!(
                    "interrupted: Plinth instance {} stopped while taking it",
                    r.instance
                ),
                "plinth",
            )
            .await?;
            match self.objects.open(&r.store) {
                Ok(bucket) => {
                    for o in [r.object.clone(), format!("{}.json", r.object)] {
                        if let Err(e) = bucket.delete(&o).await {
                            tracing::warn!(cluster, snapshot = %r.id, error = %e, "cannot remove an interrupted snapshot's object");
                        }
                    }
                    if let Err(e) = bucket.delete_partial(&r.object).await {
                        tracing::warn!(cluster, snapshot = %r.id, error = %e, "cannot remove an interrupted snapshot's partial upload");
                    }
                }
                Err(e) => {
                    tracing::warn!(cluster, snapshot = %r.id, error = %e, "cannot open an interrupted snapshot's store")
                }
            }
        }
        Ok(())
    }

    /// At start: every cluster with rows left `taking` by an instance that stopped gets them
    /// failed and their leftovers removed, as soon as its turn can be claimed (the dead holder's
    /// expires after `turn`). Returns how many clusters still wait for their turn.
    pub async fn clean_up_interrupted(&self) -> Result<usize, ServiceError> {
        let mut waiting = 0;
        for name in self.clusters.names().await? {
            let list = self.store.snapshots(&name, 1000).await?;
            if !list.iter().any(|r| r.state == SnapshotState::Taking) {
                continue;
            }
            let Some(_mine) = TakingGuard::new(&self.taking, &name) else {
                continue;
            };
            let now = Utc::now();
            if !self
                .store
                .take_snapshot_turn(
                    &name,
                    &self.settings.instance,
                    now,
                    now + self.settings.turn,
                )
                .await?
            {
                waiting += 1;
                continue;
            }
            let r = self.fail_interrupted(&name).await;
            self.store
                .release_snapshot_turn(&name, &self.settings.instance)
                .await?;
            r?;
        }
        Ok(waiting)
    }

    /// Stream from `node`, check, seal, store; then read back and verify. Fills in `rec`.
    async fn stream_store_verify(
        &self,
        rec: &mut SnapshotRecord,
        node: &TalosNode,
        bucket: &dyn ObjectBucket,
        lost: &tokio_util::sync::CancellationToken,
    ) -> Result<(), String> {
        let stream = self
            .clusters
            .api()
            .etcd_snapshot(node)
            .await
            .map_err(|e| e.to_string())?;
        let key = self.secrets.derive_key(&key_purpose(&rec.cluster));
        let purpose = chunk_purpose(&rec.cluster, rec.id);
        let (sealer, header) = Sealer::new(&key, &purpose);
        let check = Arc::new(Mutex::new(Some(SnapshotCheck::new())));
        let body = sealed_body(
            stream,
            sealer,
            header,
            check.clone(),
            bucket.url().to_string(),
            rec.object.clone(),
            lost.clone(),
        );
        let stored = bucket
            .put_stream(&rec.object, body)
            .await
            .map_err(obj_err)?;
        let check = check
            .lock()
            .ok()
            .and_then(|mut c| c.take())
            .ok_or("the snapshot check was lost")?;
        let facts = check.finish().map_err(|e| e.to_string())?;
        rec.size_bytes = Some(facts.size as i64);
        rec.stored_bytes = Some(stored as i64);
        rec.sha256 = Some(facts.sha256.clone());
        rec.revision = Some(facts.revision);
        // What it is, beside it (no secret): a store outlives the database that indexed it.
        let sidecar = Sidecar {
            format: "plinth etcd snapshot v1",
            encryption: format!(
                "XChaCha20-Poly1305 STREAM (aead::stream BE32), {} KiB chunks, key derived from Plinth's secret key (fingerprint {}) for `{}`, chunks bound to `{}`",
                super::sealed_stream::CHUNK / 1024,
                self.secrets.fingerprint(),
                key_purpose(&rec.cluster),
                purpose
            ),
            record: rec,
        };
        let json = serde_json::to_vec_pretty(&sidecar).map_err(|e| e.to_string())?;
        bucket
            .put_small(&format!("{}.json", rec.object), Bytes::from(json))
            .await
            .map_err(obj_err)?;
        // Read it back: only what decrypts to the bytes the node streamed is verified.
        let (size, sha, read) = self.read_back(rec, bucket).await?;
        if lost.is_cancelled() {
            return Err(LOST_TURN.into());
        }
        if read != stored {
            return Err(format!(
                "read back {read} bytes of the stored object, {stored} were written"
            ));
        }
        if size != facts.size || sha != facts.sha256 {
            return Err(format!(
                "the stored snapshot decrypts to {size} bytes with SHA-256 {sha}, but the node streamed {} bytes with SHA-256 {}",
                facts.size, facts.sha256
            ));
        }
        Ok(())
    }

    /// Decrypt the stored object and hash it: (size, SHA-256, stored bytes).
    async fn read_back(
        &self,
        rec: &SnapshotRecord,
        bucket: &dyn ObjectBucket,
    ) -> Result<(u64, String, u64), String> {
        let mut stream = bucket.get_stream(&rec.object).await.map_err(obj_err)?;
        let key = self.secrets.derive_key(&key_purpose(&rec.cluster));
        let mut opener = Opener::new(&key, &chunk_purpose(&rec.cluster, rec.id));
        let mut digest = StreamDigest::default();
        let mut read = 0u64;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(obj_err)?;
            read += chunk.len() as u64;
            opener.push(&chunk, &mut out).map_err(|e| e.to_string())?;
            for p in out.drain(..) {
                digest.update(&p);
            }
        }
        let last = opener.finish().map_err(|e| e.to_string())?;
        digest.update(&last);
        let (size, sha) = digest.finish();
        Ok((size, sha, read))
    }

    /// Remove verified snapshots beyond `keep` (oldest first) and what failed ones left, older
    /// than `newest` (just verified). Failures are logged: the next run tries again.
    async fn retain(
        &self,
        cluster: &str,
        policy: &SnapshotPolicy,
        bucket: &dyn ObjectBucket,
        newest: &SnapshotRecord,
        actor: &str,
    ) {
        let list = match self.store.snapshots(cluster, 20_000).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(cluster, error = %e, "snapshot retention: cannot list");
                return;
            }
        };
        let mut verified = 0u32;
        for r in list {
            let drop = match r.state {
                SnapshotState::Verified => {
                    verified += 1;
                    verified > policy.keep
                }
                SnapshotState::Failed => r.started_at < newest.started_at,
                _ => false,
            };
            if !drop {
                continue;
            }
            // Only objects of this store (a policy that moved leaves the old store alone).
            if r.store != bucket.url() {
                continue;
            }
            let removed = async {
                bucket.delete(&r.object).await?;
                bucket.delete(&format!("{}.json", r.object)).await
            }
            .await;
            if let Err(e) = removed {
                tracing::warn!(cluster, snapshot = %r.id, error = %e, "snapshot retention: cannot remove; tried again after the next snapshot");
                continue;
            }
            let why = if r.state == SnapshotState::Verified {
                format!("more than {} verified snapshots are kept", policy.keep)
            } else {
                "a failed snapshot's leftovers".into()
            };
            if let Err(e) = self
                .store
                .mark_snapshot_deleted(
                    r.id,
                    &event(
                        "cluster.snapshot_deleted",
                        actor,
                        serde_json::json!({"cluster": cluster, "snapshot": r.id, "object": r.object, "reason": why, "newer_verified": newest.id}),
                    ),
                )
                .await
            {
                tracing::warn!(cluster, snapshot = %r.id, error = %e, "snapshot retention: removed but not recorded");
            }
        }
    }

    /// The schedule: every cluster whose policy says a snapshot is due gets one (one instance
    /// at a time). Called by the server's snapshot task; safe on several instances.
    pub async fn tick(&self) -> Result<(), ServiceError> {
        let now = Utc::now();
        for name in self.clusters.names().await? {
            let Ok(spec) = self.clusters.spec(&name).await else {
                continue;
            };
            let Some(policy) = spec.etcd_snapshots else {
                if let Ok(mut ages) = self.ages.0.lock() {
                    ages.remove(&name);
                }
                continue;
            };
            let list = self.store.snapshots(&name, 200).await?;
            let newest_verified = list.iter().find(|r| r.state == SnapshotState::Verified);
            if let Ok(mut ages) = self.ages.0.lock() {
                match newest_verified {
                    Some(r) => {
                        ages.insert(name.clone(), r.started_at);
                    }
                    None => {
                        ages.entry(name.clone()).or_insert(now);
                    }
                }
            }
            let every = Duration::from_std(policy.every.0).unwrap_or(Duration::hours(6));
            let due = newest_verified.is_none_or(|r| r.started_at + every <= now);
            let last_attempt = list.first();
            let backing_off = last_attempt.is_some_and(|r| {
                r.state == SnapshotState::Failed && r.started_at + self.settings.retry_after > now
            }) || last_attempt.is_some_and(|r| {
                r.state == SnapshotState::Taking && r.started_at + self.settings.turn > now
            });
            if !due || backing_off {
                continue;
            }
            match self.take(&name, "plinth").await {
                Ok(_) | Err(SnapshotError::Busy(_)) => {}
                Err(SnapshotError::Service(e)) => return Err(e),
                Err(e) => {
                    if matches!(e, SnapshotError::NotPossible(_)) {
                        // Nothing recorded: still an event and a metric an alert can watch.
                        self.failures
                            .get_or_create(&ClusterLabel {
                                cluster: name.clone(),
                            })
                            .inc();
                        self.events
                            .append_event(&event(
                                "cluster.snapshot_failed",
                                "plinth",
                                serde_json::json!({"cluster": name, "error": e.to_string()}),
                            ))
                            .await?;
                    }
                    tracing::warn!(cluster = %name, error = %e, "scheduled etcd snapshot not taken");
                }
            }
        }
        Ok(())
    }

    /// Recover `cluster`'s etcd from a snapshot: see the module's text.
    pub async fn recover(
        &self,
        cluster: &str,
        req: &RecoverRequest,
        actor: &str,
    ) -> Result<RecoveryRecord, RecoverError> {
        self.recover_notify(cluster, req, actor, None).await
    }

    /// `recover`, sending the claimed recovery on `claimed` before the snapshot is uploaded
    /// (the HTTP API answers 202 with it when the recovery takes longer than the caller waits).
    pub async fn recover_notify(
        &self,
        cluster: &str,
        req: &RecoverRequest,
        actor: &str,
        claimed: Option<tokio::sync::oneshot::Sender<RecoveryRecord>>,
    ) -> Result<RecoveryRecord, RecoverError> {
        let snap = self.get(cluster, req.snapshot).await.map_err(|e| match e {
            ServiceError::NotFound(what) => RecoverError::NotPossible(format!(
                "{what} not found (plinth cluster snapshots {cluster})"
            )),
            other => RecoverError::Service(other),
        })?;
        if snap.state != SnapshotState::Verified {
            return Err(RecoverError::NotPossible(format!(
                "snapshot {} of cluster {cluster} is {}: only a verified snapshot can be restored",
                snap.id, snap.state
            )));
        }
        if let Some(r) = self
            .store
            .recovery(cluster)
            .await
            .map_err(ServiceError::from)?
        {
            return Err(RecoverError::Already(Box::new(r)));
        }
        let cps = self.control_planes(cluster).await?;
        if cps.is_empty() {
            return Err(RecoverError::NotPossible(format!(
                "cluster {cluster} has no installed control plane with a known address"
            )));
        }
        let view = self.etcd_view(cluster, &cps).await?;
        let forced = if view.quorum_held() {
            let typed = req.confirm.as_deref() == Some(cluster);
            if !(req.force && typed) {
                return Err(RecoverError::QuorumHeld(format!(
                    "etcd of cluster {cluster} still has quorum ({} of {} members healthy: {}): recovering from a snapshot would throw away every write since it and start a second etcd beside the running one. Recover only after losing the majority; to do it anyway, force it and type the cluster's name as confirmation (--force --confirm {cluster})",
                    view.healthy.len(),
                    view.members.len(),
                    view.healthy.join(", ")
                )));
            }
            true
        } else {
            false
        };
        // The node: named, or the first control plane whose etcd waits for a bootstrap.
        let target = match &req.node {
            Some(n) => cps
                .iter()
                .find(|c| {
                    c.machine.hostname.as_deref() == Some(n.as_str())
                        || c.machine.id.to_string() == *n
                        || c.ip.to_string() == *n
                })
                .ok_or_else(|| {
                    RecoverError::NotPossible(format!(
                        "cluster {cluster} has no installed control plane {n}"
                    ))
                })?,
            None => {
                let mut found = None;
                for c in &cps {
                    if !view.healthy.contains(&c.machine.display_name()) {
                        let node = self.clusters.talos_node(cluster, c.ip, "os:reader").await?;
                        if self.clusters.api().version(&node).await.is_ok() {
                            found = Some(c);
                            break;
                        }
                    }
                }
                found.ok_or_else(|| {
                    RecoverError::NotPossible(format!(
                        "no control plane of cluster {cluster} answers with etcd waiting for a bootstrap: wipe a control plane's EPHEMERAL partition (talosctl reset --system-labels-to-wipe EPHEMERAL --reboot) and try again, or name one with --node"
                    ))
                })?
            }
        };
        let name = target.machine.display_name();
        if view.healthy.contains(&name) {
            return Err(RecoverError::NotPossible(format!(
                "etcd runs on {name}: Talos restores a snapshot only onto a control plane whose etcd waits for a bootstrap (wipe its EPHEMERAL partition first)"
            )));
        }
        let claim = RecoveryRecord {
            cluster: cluster.to_string(),
            attempt_id: Uuid::new_v4(),
            snapshot_id: snap.id,
            node: name.clone(),
            node_address: target.ip.to_string(),
            instance: self.settings.instance.clone(),
            requested_by: actor.to_string(),
            forced,
            state: RecoveryState::Calling,
            claimed_at: Utc::now(),
            finished_at: None,
            detail: None,
        };
        let detail = serde_json::json!({"cluster": cluster, "snapshot": snap.id, "node": name,
            "address": claim.node_address, "forced": forced, "revision": snap.revision,
            "members_before": view.members, "healthy_before": view.healthy});
        if let Some(existing) = self
            .store
            .claim_recovery(
                &claim,
                &event("cluster.recovery_claimed", actor, detail.clone()),
            )
            .await
            .map_err(ServiceError::from)?
        {
            return Err(RecoverError::Already(Box::new(existing)));
        }
        tracing::warn!(cluster, node = %name, snapshot = %snap.id, forced, actor, "recovering etcd from a snapshot");
        if let Some(tx) = claimed {
            let _ = tx.send(claim.clone());
        }
        let admin = self
            .clusters
            .talos_node(cluster, target.ip, "os:admin")
            .await?;
        let outcome = self.restore(&snap, &admin).await;
        let finish = |state: RecoveryState, text: String, kind: &'static str| {
            let claim = claim.clone();
            let mut d = detail.clone();
            if let Some(o) = d.as_object_mut() {
                o.insert("result".into(), serde_json::Value::String(text.clone()));
            }
            async move {
                let at = Utc::now();
                self.store
                    .finish_recovery(
                        cluster,
                        claim.attempt_id,
                        state,
                        &text,
                        at,
                        &event(kind, actor, d),
                    )
                    .await
                    .map_err(ServiceError::from)?;
                let mut r = claim;
                r.state = state;
                r.finished_at = Some(at);
                r.detail = Some(text);
                Ok::<_, RecoverError>(r)
            }
        };
        match outcome {
            Ok(()) => {}
            Err(Restore::NothingChanged(cause)) => {
                // Nothing reached the node's etcd: the claim is given back, it may be tried again.
                let mut d = detail.clone();
                if let Some(o) = d.as_object_mut() {
                    o.insert("error".into(), serde_json::Value::String(cause.clone()));
                }
                self.store
                    .release_recovery(
                        cluster,
                        claim.attempt_id,
                        &event("cluster.recovery_refused", actor, d),
                    )
                    .await
                    .map_err(ServiceError::from)?;
                return Err(RecoverError::Failed {
                    cluster: cluster.to_string(),
                    cause: format!("{cause} (nothing changed on the node; it may be tried again)"),
                });
            }
            Err(Restore::Unknown(cause)) => {
                finish(
                    RecoveryState::Failed,
                    cause.clone(),
                    "cluster.recovery_failed",
                )
                .await?;
                return Err(RecoverError::Failed {
                    cluster: cluster.to_string(),
                    cause,
                });
            }
        }
        // The other control planes join on their own (their etcd waits for one to bootstrap).
        let want: Vec<String> = cps.iter().map(|c| c.machine.display_name()).collect();
        let deadline = tokio::time::Instant::now() + self.settings.rejoin_wait;
        let reader = self
            .clusters
            .talos_node(cluster, target.ip, "os:reader")
            .await?;
        let mut members: Vec<String> = Vec::new();
        loop {
            // Each control plane's etcd as it reports it, then the members as the restored
            // node lists them.
            for c in &cps {
                let node = self.clusters.talos_node(cluster, c.ip, "os:reader").await?;
                let _ = self.etcd_healthy(&node).await;
            }
            if let Ok(m) = self.clusters.api().etcd_members(&reader).await {
                members = m.into_iter().map(|m| m.hostname).collect();
            }
            if want.iter().all(|w| members.contains(w)) || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(self.settings.poll).await;
        }
        let missing: Vec<&String> = want.iter().filter(|w| !members.contains(w)).collect();
        let text = if missing.is_empty() {
            format!(
                "etcd restored from snapshot {} (revision {}) on {name}; every control plane rejoined: {}",
                snap.id,
                snap.revision.unwrap_or_default(),
                members.join(", ")
            )
        } else {
            format!(
                "etcd restored from snapshot {} (revision {}) on {name}; members now: {}; not (yet) rejoined within {:?}: {} (wipe their EPHEMERAL partition so their etcd waits to join)",
                snap.id,
                snap.revision.unwrap_or_default(),
                members.join(", "),
                self.settings.rejoin_wait,
                missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            )
        };
        finish(RecoveryState::Done, text, "cluster.recovered").await
    }

    /// Upload the snapshot, decrypting as it streams, then bootstrap from it.
    async fn restore(&self, snap: &SnapshotRecord, node: &TalosNode) -> Result<(), Restore> {
        let bucket = self
            .objects
            .open(&snap.store)
            .map_err(|e| Restore::NothingChanged(obj_err(e)))?;
        let stream = bucket
            .get_stream(&snap.object)
            .await
            .map_err(|e| Restore::NothingChanged(obj_err(e)))?;
        let key = self.secrets.derive_key(&key_purpose(&snap.cluster));
        let opener = Opener::new(&key, &chunk_purpose(&snap.cluster, snap.id));
        let upload = opened_body(
            stream,
            opener,
            snap.size_bytes.unwrap_or(-1),
            snap.sha256.clone().unwrap_or_default(),
        );
        // An upload alone changes nothing: the node keeps it for a bootstrap that asks for it.
        self.clusters
            .api()
            .etcd_recover(node, upload)
            .await
            .map_err(|e: TalosApiError| Restore::NothingChanged(e.to_string()))?;
        self.clusters
            .api()
            .bootstrap(
                node,
                BootstrapOptions {
                    recover_etcd: true,
                    recover_skip_hash_check: false,
                },
            )
            .await
            .map_err(|e| {
                let text =
                    format!("the snapshot was uploaded, but the bootstrap from it failed: {e}");
                let refused_before = !e.request_sent
                    || matches!(
                        e.failure,
                        TalosApiFailure::Refused(
                            StatusCode::FailedPrecondition
                                | StatusCode::AlreadyExists
                                | StatusCode::PermissionDenied
                                | StatusCode::Unauthenticated
                                | StatusCode::InvalidArgument
                        )
                    );
                if refused_before {
                    Restore::NothingChanged(text)
                } else {
                    Restore::Unknown(text)
                }
            })
    }
}

/// The sealed object's bytes: the header, then each sealed chunk as the node's bytes arrive,
/// checked on the way; a failure of the node ends the body with an error (the upload is
/// aborted).
fn sealed_body(
    stream: super::ports::talos_api::SnapshotStream,
    sealer: Sealer,
    header: Bytes,
    check: Arc<Mutex<Option<SnapshotCheck>>>,
    store: String,
    object: String,
    lost: tokio_util::sync::CancellationToken,
) -> ByteStream {
    let fail = move |cause: String| ObjectError {
        store: store.clone(),
        object: object.clone(),
        cause,
        not_found: false,
    };
    let head = futures::stream::once(async move { Ok::<Bytes, ObjectError>(header) });
    let chunks = futures::stream::unfold(
        (stream, Some(sealer), check, fail),
        move |(mut stream, sealer, check, fail)| {
            let lost = lost.clone();
            async move {
            let mut sealer = sealer?;
            let next = tokio::select! {
                biased;
                () = lost.cancelled() => {
                    return Some((vec![Err(fail(LOST_TURN.into()))], (stream, None, check, fail)));
                }
                n = stream.next() => n,
            };
            match next {
                Some(Ok(data)) => {
                    if let Ok(mut c) = check.lock() {
                        if let Some(c) = c.as_mut() {
                            c.update(&data);
                        }
                    }
                    let mut out = Vec::new();
                    let r = sealer
                        .push(&data, &mut out)
                        .map_err(|e| fail(e.to_string()));
                    let items: Vec<Result<Bytes, ObjectError>> = match r {
                        Ok(()) => out.into_iter().map(Ok).collect(),
                        Err(e) => return Some((vec![Err(e)], (stream, None, check, fail))),
                    };
                    Some((items, (stream, Some(sealer), check, fail)))
                }
                Some(Err(e)) => Some((
                    vec![Err(fail(format!("the node's stream failed: {e}")))],
                    (stream, None, check, fail),
                )),
                None => {
                    let last = sealer.finish().map_err(|e| fail(e.to_string()));
                    Some((vec![last], (stream, None, check, fail)))
                }
            }
            }
        },
    )
    .flat_map(futures::stream::iter);
    head.chain(chunks).boxed()
}

/// The snapshot's plain bytes from its sealed object, checked against the recorded size and
/// SHA-256 before the last bytes go out: anything wrong is an `Err` item, which abandons the
/// upload, so the node never receives a complete upload of the wrong bytes.
fn opened_body(
    stream: ByteStream,
    opener: Opener,
    size: i64,
    sha256: String,
) -> super::ports::talos_api::UploadStream {
    futures::stream::unfold(
        (stream, Some((opener, StreamDigest::default()))),
        move |(mut stream, state)| {
            let sha256 = sha256.clone();
            async move {
                let (mut opener, mut digest) = state?;
                match stream.next().await {
                    Some(Ok(chunk)) => {
                        let mut out = Vec::new();
                        if let Err(e) = opener.push(&chunk, &mut out) {
                            return Some((vec![Err(e.to_string())], (stream, None)));
                        }
                        let items = out
                            .into_iter()
                            .map(|p| {
                                digest.update(&p);
                                Ok(p.to_vec())
                            })
                            .collect::<Vec<_>>();
                        Some((items, (stream, Some((opener, digest)))))
                    }
                    Some(Err(e)) => Some((vec![Err(e.to_string())], (stream, None))),
                    None => {
                        let last = match opener.finish() {
                            Ok(l) => l,
                            Err(e) => return Some((vec![Err(e.to_string())], (stream, None))),
                        };
                        digest.update(&last);
                        let (n, sha) = digest.finish();
                        let item = if n as i64 == size && sha == sha256 {
                            Ok(last.to_vec())
                        } else {
                            Err(format!(
                                "the stored snapshot decrypts to {n} bytes with SHA-256 {sha}, not the {size} bytes with SHA-256 {sha256} recorded"
                            ))
                        };
                        Some((vec![item], (stream, None)))
                    }
                }
            }
        },
    )
    .flat_map(futures::stream::iter)
    .boxed()
}

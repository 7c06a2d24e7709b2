//! Cluster use cases over the Talos API: verifying an install (the node answers `Version` over
//! mutual TLS with a certificate chained to the cluster's OS CA, running the declared version),
//! bootstrapping each cluster's etcd exactly once, credentials for humans (`talosconfig`,
//! `kubeconfig`), and measuring health (per node: version, apid, services, etcd membership and
//! leader; per cluster: how many control planes may be lost now).
//!
//! Bootstrap exactly once: the claim (a row keyed by the cluster, with node, instance, who asked
//! and when) is written in one transaction before the call, the outcome after. A second claim
//! finds the row and is refused naming it, whichever instance makes it; a claim whose outcome is
//! unknown (Plinth stopped or the connection broke during the call) is never retried by Plinth:
//! a later health check that finds etcd running on that node records it done. The automatic
//! bootstrap also refuses to act when any control plane already reports etcd members: Plinth
//! records such a cluster as found bootstrapped instead.
//!
//! Client certificates are signed here from the cluster's OS CA for a few minutes, kept in memory
//! only, with the least role a call needs (`os:reader` to look, `os:admin` to bootstrap).
//!
//! Imports `domain`, `talos` (certificates, bundles) and the rest of `service`; nothing from
//! `store`, `http` or `talos_api`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::ports::talos_api::{
    BootstrapOptions, ClusterCheck, ClusterNodes, EtcdMember, ServiceStatus, StatusCode, TalosApi,
    TalosApiError, TalosApiFailure, TalosCredentials, TalosNode,
};
use super::ports::talos_state::{
    BootstrapRecord, BootstrapState, NodeVerification, TalosStateStore,
};
use super::ports::{EventStore, MachineFilter, MachineStore, NewEvent};
use super::{ClusterSecretInput, ConfigService, MachineConfigError, ServiceError};
use crate::domain::{LifecycleState, Machine, MachineId, Role};
use crate::talos::pki::{self, CaPem};
use crate::talos::secrets::SecretsBundle;

pub use super::ports::configs::BootstrapMode;

/// Knobs of the cluster use cases.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    /// Port of the Talos API (apid).
    pub talos_api_port: u16,
    /// Lifetime of the client certificates Plinth uses itself.
    pub cert_ttl: Duration,
    /// How long Talos' own cluster health check may wait.
    pub health_wait: std::time::Duration,
    /// This instance's name, recorded with each bootstrap it claims.
    pub instance: String,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            talos_api_port: 50000,
            cert_ttl: Duration::minutes(10),
            health_wait: std::time::Duration::from_secs(20),
            instance: default_instance(),
        }
    }
}

/// `hostname/pid`: which Plinth process claimed a bootstrap.
pub fn default_instance() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "plinth".into());
    format!("{host}/{}", std::process::id())
}

/// What verifying an install found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    /// The node is ours and runs the declared version (recorded).
    Verified(NodeVerification),
    /// Not answering yet (booting): ask again later.
    NotYet(String),
    /// Something answered that is not our node, or not running our config: fail the install.
    Rejected(String),
}

/// One node in a health report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeHealth {
    /// Host name (or id) of the machine.
    pub machine: String,
    /// Inventory id.
    pub machine_id: MachineId,
    /// Role.
    pub role: Option<Role>,
    /// Lifecycle state.
    pub state: LifecycleState,
    /// The address asked.
    pub address: Option<String>,
    /// Its Talos API answered over mTLS.
    pub apid: bool,
    /// Talos version it reports.
    pub talos_version: Option<String>,
    /// etcd, kubelet, apid, trustd (as far as the node runs them).
    pub services: Vec<ServiceStatus>,
    /// Its etcd member id, when it is a member.
    pub etcd_member_id: Option<u64>,
    /// Why something could not be read.
    pub error: Option<String>,
}

/// etcd as seen from the control planes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EtcdHealth {
    /// Members (from the first control plane that answered).
    pub members: Vec<EtcdMember>,
    /// The leader's member id, if one is known.
    pub leader: Option<u64>,
    /// The leader's host name.
    pub leader_hostname: Option<String>,
    /// Members whose node answered with etcd running and healthy.
    pub healthy_members: u32,
    /// Majority of the members.
    pub quorum: u32,
    /// How many more members may be lost now without losing quorum (negative: quorum lost).
    pub quorum_margin: i64,
}

/// A cluster's measured health.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterHealth {
    /// Cluster.
    pub cluster: String,
    /// When it was measured.
    pub checked_at: DateTime<Utc>,
    /// Every node of the cluster.
    pub nodes: Vec<NodeHealth>,
    /// Nodes whose Talos API answered.
    pub nodes_up: u32,
    /// etcd, once bootstrapped and reachable.
    pub etcd: Option<EtcdHealth>,
    /// Talos' own cluster check, run by a control plane.
    pub talos_check: Option<ClusterCheck>,
    /// The cluster's bootstrap.
    #[schema(value_type = Option<Object>)]
    pub bootstrap: Option<BootstrapRecord>,
}

/// Why a bootstrap was not made.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The cluster's bootstrap was already claimed.
    #[error("{}", already_text(.0))]
    Already(Box<BootstrapRecord>),
    /// No suitable node, or the node is not ready.
    #[error("{0}")]
    NotPossible(String),
    /// The node refused and did nothing (claim released; may be tried again).
    #[error("the node refused the bootstrap (nothing happened; it may be tried again): {0}")]
    Refused(TalosApiError),
    /// The call may have reached the node but its outcome is unknown (never retried by Plinth).
    #[error("the bootstrap's outcome is unknown (never retried automatically): {0}")]
    Unknown(TalosApiError),
    /// Anything else (store, secrets).
    #[error(transparent)]
    Service(#[from] ServiceError),
}

fn already_text(r: &BootstrapRecord) -> String {
    match r.state {
        BootstrapState::Calling => format!(
            "cluster {} has a bootstrap in progress or of unknown outcome: claimed on node {} ({}) at {} by instance {} for {}; Plinth never calls Bootstrap twice",
            r.cluster, r.node, r.node_address, r.claimed_at.to_rfc3339(), r.instance, r.requested_by
        ),
        BootstrapState::Done => format!(
            "cluster {} was bootstrapped on node {} ({}) at {} by instance {} for {}; bootstrapping again would create a separate etcd",
            r.cluster,
            r.node,
            r.node_address,
            r.finished_at.unwrap_or(r.claimed_at).to_rfc3339(),
            r.instance,
            r.requested_by
        ),
        BootstrapState::Found => format!(
            "cluster {} is already bootstrapped: Plinth found etcd running on node {} ({}) at {}; bootstrapping again would create a separate etcd",
            r.cluster,
            r.node,
            r.node_address,
            r.finished_at.unwrap_or(r.claimed_at).to_rfc3339()
        ),
    }
}

/// Label of the per-cluster gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ClusterLabel {
    /// Cluster name.
    pub cluster: String,
}

type ClusterGauge = prometheus_client::metrics::family::Family<
    ClusterLabel,
    prometheus_client::metrics::gauge::Gauge,
>;

/// Client credentials by (cluster, role).
type CredentialCache = HashMap<(String, String), Arc<TalosCredentials>>;

/// The gauges of the last measurement of each cluster.
#[derive(Clone, Default)]
struct Gauges {
    nodes_up: ClusterGauge,
    etcd_healthy: ClusterGauge,
    quorum_margin: ClusterGauge,
}

/// The cluster use cases.
#[derive(Clone)]
pub struct Clusters {
    machines: Arc<dyn MachineStore>,
    events: Arc<dyn EventStore>,
    state: Arc<dyn TalosStateStore>,
    configs: ConfigService,
    api: Arc<dyn TalosApi>,
    settings: ClusterSettings,
    creds: Arc<Mutex<CredentialCache>>,
    gauges: Gauges,
}

fn event(
    machine: Option<MachineId>,
    kind: &str,
    actor: &str,
    detail: serde_json::Value,
) -> NewEvent {
    NewEvent {
        machine_id: machine,
        kind: kind.into(),
        actor: actor.into(),
        detail,
    }
}

/// The Talos OS CA and the Kubernetes CA of a cluster's secret input.
fn cas(input: &ClusterSecretInput) -> Result<(CaPem, CaPem), String> {
    match input {
        ClusterSecretInput::Bundle(text) => {
            let b = SecretsBundle::parse(text).map_err(|e| e.to_string())?;
            let get = |c: &crate::talos::secrets::CertAndKey, what: &'static str| {
                let crt = c
                    .crt
                    .as_deref()
                    .ok_or_else(|| format!("{what} has no certificate"))?;
                CaPem::from_base64(crt, &c.key, what).map_err(|e| e.to_string())
            };
            Ok((
                get(&b.certs.os, "Talos OS CA")?,
                get(&b.certs.k8s, "Kubernetes CA")?,
            ))
        }
        ClusterSecretInput::BaseConfigs { controlplane, .. } => {
            let doc: serde_yaml_ng::Value = serde_yaml_ng::Deserializer::from_str(controlplane)
                .next()
                .and_then(|d| serde_yaml_ng::Value::deserialize(d).ok())
                .ok_or("the control-plane base config does not parse")?;
            let get = |v: &serde_yaml_ng::Value, what: &'static str| {
                let crt = v["crt"].as_str().ok_or_else(|| format!("{what}: no crt"))?;
                let key = v["key"].as_str().ok_or_else(|| format!("{what}: no key"))?;
                CaPem::from_base64(crt, key, what).map_err(|e| e.to_string())
            };
            Ok((
                get(&doc["machine"]["ca"], "machine.ca")?,
                get(&doc["cluster"]["ca"], "cluster.ca")?,
            ))
        }
    }
}

fn talos_role_for(call: &str) -> &'static str {
    match call {
        "bootstrap" => "os:admin",
        _ => "os:reader",
    }
}

/// A machine's address for its Talos API: its verified address, else its first reserved one.
fn node_address(m: &Machine, verified: Option<&NodeVerification>) -> Option<IpAddr> {
    verified
        .and_then(|v| v.address.parse().ok())
        .or_else(|| m.interfaces.iter().find_map(|i| i.ipv4).map(IpAddr::V4))
}

impl Clusters {
    /// Over the machines, the event log, the Talos API's state, the declared clusters and a
    /// Talos API client.
    pub fn new(
        machines: Arc<dyn MachineStore>,
        events: Arc<dyn EventStore>,
        state: Arc<dyn TalosStateStore>,
        configs: ConfigService,
        api: Arc<dyn TalosApi>,
        settings: ClusterSettings,
    ) -> Self {
        Clusters {
            machines,
            events,
            state,
            configs,
            api,
            settings,
            creds: Arc::default(),
            gauges: Gauges::default(),
        }
    }

    /// Register the per-cluster gauges (`plinth_cluster_nodes_up`,
    /// `plinth_cluster_etcd_members_healthy`, `plinth_cluster_quorum_margin`).
    pub fn register_metrics(&self, metrics: &crate::metrics::Metrics) {
        metrics.register(
            "cluster_nodes_up",
            "Nodes of the cluster whose Talos API answered at the last health check",
            self.gauges.nodes_up.clone(),
        );
        metrics.register(
            "cluster_etcd_members_healthy",
            "etcd members of the cluster running and healthy at the last health check",
            self.gauges.etcd_healthy.clone(),
        );
        metrics.register(
            "cluster_quorum_margin",
            "Control planes the cluster may lose now without losing etcd quorum (negative: lost)",
            self.gauges.quorum_margin.clone(),
        );
    }

    /// The settings.
    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    async fn secret_input(&self, cluster: &str) -> Result<ClusterSecretInput, ServiceError> {
        let sources = self.configs.sources().await?;
        let rec = sources
            .clusters
            .get(cluster)
            .ok_or_else(|| ServiceError::NotFound(format!("cluster {cluster}")))?;
        Ok(self.configs.cluster_secret_input(rec)?)
    }

    async fn cas(&self, cluster: &str) -> Result<(CaPem, CaPem), ServiceError> {
        let input = self.secret_input(cluster).await?;
        cas(&input).map_err(|e| {
            ServiceError::Config(MachineConfigError::Secrets(format!(
                "cluster {cluster}: {e}"
            )))
        })
    }

    /// Credentials with `role` for `cluster`'s nodes, reused while they have more than a third
    /// of their life left.
    pub async fn credentials(
        &self,
        cluster: &str,
        role: &str,
    ) -> Result<Arc<TalosCredentials>, ServiceError> {
        let key = (cluster.to_string(), role.to_string());
        let now = Utc::now();
        if let Ok(cache) = self.creds.lock() {
            if let Some(c) = cache.get(&key) {
                if c.expires_at - now > self.settings.cert_ttl / 3 {
                    return Ok(c.clone());
                }
            }
        }
        let (os, _) = self.cas(cluster).await?;
        let issued = pki::talos_client_cert(&os, role, now, self.settings.cert_ttl)
            .map_err(|e| ServiceError::Config(MachineConfigError::Secrets(e.to_string())))?;
        let c = Arc::new(TalosCredentials {
            ca_pem: issued.ca_pem,
            cert_pem: issued.cert_pem,
            key_pem: issued.key_pem,
            role: role.to_string(),
            expires_at: issued.not_after,
        });
        if let Ok(mut cache) = self.creds.lock() {
            cache.insert(key, c.clone());
        }
        Ok(c)
    }

    async fn node(&self, cluster: &str, ip: IpAddr, call: &str) -> Result<TalosNode, ServiceError> {
        Ok(TalosNode {
            endpoint: SocketAddr::new(ip, self.settings.talos_api_port),
            credentials: self.credentials(cluster, talos_role_for(call)).await?,
        })
    }

    /// The declared Talos version of a cluster.
    async fn declared_version(&self, cluster: &str) -> Result<String, ServiceError> {
        let sources = self.configs.sources().await?;
        sources
            .clusters
            .get(cluster)
            .map(|c| c.spec.talos_version.clone())
            .ok_or_else(|| ServiceError::NotFound(format!("cluster {cluster}")))
    }

    /// Verify the install of `m` at `address`: `Version` over mTLS, the certificate chained to
    /// the cluster's OS CA, the version the cluster declares. Records what the node reported.
    pub async fn verify_install(
        &self,
        m: &Machine,
        address: &str,
    ) -> Result<Verification, ServiceError> {
        let Some(cluster) = m.cluster.as_deref() else {
            return Ok(Verification::Rejected(
                "the machine has no cluster: its Talos API cannot be verified".into(),
            ));
        };
        let Ok(ip) = address.parse::<IpAddr>() else {
            return Ok(Verification::Rejected(format!(
                "`{address}` is not an IP address"
            )));
        };
        let want = self.declared_version(cluster).await?;
        let node = self.node(cluster, ip, "version").await?;
        let v = match self.api.version(&node).await {
            Ok(v) => v,
            Err(e) => {
                return Ok(match e.failure {
                    TalosApiFailure::Unreachable | TalosApiFailure::Timeout => {
                        Verification::NotYet(e.to_string())
                    }
                    TalosApiFailure::Refused(StatusCode::Unavailable) => {
                        Verification::NotYet(e.to_string())
                    }
                    _ => Verification::Rejected(e.to_string()),
                })
            }
        };
        if v.tag != want {
            return Ok(Verification::Rejected(format!(
                "the node at {} runs Talos {}, but cluster {cluster} declares {want}",
                node.endpoint, v.tag
            )));
        }
        let rec = NodeVerification {
            machine_id: m.id,
            address: ip.to_string(),
            talos_version: v.tag.clone(),
            cert_sha256: v.cert_sha256.clone(),
            verified_at: Utc::now(),
        };
        self.state
            .record_verification(
                &rec,
                &event(
                    Some(m.id),
                    "talos.verified",
                    "plinth",
                    serde_json::json!({
                        "cluster": cluster, "address": rec.address, "talos_version": v.tag,
                        "cert_sha256": v.cert_sha256, "arch": v.arch, "platform": v.platform,
                    }),
                ),
            )
            .await?;
        Ok(Verification::Verified(rec))
    }

    /// Every machine of a cluster.
    async fn machines(&self, cluster: &str) -> Result<Vec<Machine>, ServiceError> {
        let filter = MachineFilter {
            cluster: Some(cluster.to_string()),
            limit: 1000,
            ..Default::default()
        };
        Ok(self.machines.all_machines(&filter).await?)
    }

    async fn verifications(&self) -> Result<HashMap<MachineId, NodeVerification>, ServiceError> {
        Ok(self
            .state
            .verifications()
            .await?
            .into_iter()
            .map(|v| (v.machine_id, v))
            .collect())
    }

    /// A cluster's bootstrap record.
    pub async fn bootstrap_record(
        &self,
        cluster: &str,
    ) -> Result<Option<BootstrapRecord>, ServiceError> {
        Ok(self.state.cluster_bootstrap(cluster).await?)
    }

    /// Bootstrap `cluster` by hand (`plinth cluster bootstrap`), on `node` (a host name, id or
    /// address) or on the first verified control plane.
    pub async fn bootstrap(
        &self,
        cluster: &str,
        node: Option<&str>,
        actor: &str,
    ) -> Result<BootstrapRecord, BootstrapError> {
        self.declared_version(cluster).await?;
        if let Some(r) = self
            .state
            .cluster_bootstrap(cluster)
            .await
            .map_err(ServiceError::from)?
        {
            return Err(BootstrapError::Already(Box::new(r)));
        }
        let machines = self.machines(cluster).await?;
        let verified = self.verifications().await?;
        let target = match node {
            Some(n) => machines
                .iter()
                .find(|m| {
                    m.hostname.as_deref() == Some(n)
                        || m.id.to_string() == n
                        || node_address(m, verified.get(&m.id)).map(|a| a.to_string()).as_deref()
                            == Some(n)
                })
                .ok_or_else(|| {
                    BootstrapError::NotPossible(format!("cluster {cluster} has no machine {n}"))
                })?,
            None => self.first_control_plane(&machines, &verified).ok_or_else(|| {
                BootstrapError::NotPossible(format!(
                    "cluster {cluster} has no installed control plane whose Talos API was verified; name one with --node"
                ))
            })?,
        };
        if target.role != Some(Role::ControlPlane) {
            return Err(BootstrapError::NotPossible(format!(
                "{} is not a control plane: only a control plane can bootstrap etcd",
                target.display_name()
            )));
        }
        let ip = node_address(target, verified.get(&target.id)).ok_or_else(|| {
            BootstrapError::NotPossible(format!("{} has no known address", target.display_name()))
        })?;
        self.bootstrap_on(cluster, target, ip, actor).await
    }

    fn first_control_plane<'a>(
        &self,
        machines: &'a [Machine],
        verified: &HashMap<MachineId, NodeVerification>,
    ) -> Option<&'a Machine> {
        machines
            .iter()
            .filter(|m| m.role == Some(Role::ControlPlane) && m.state == LifecycleState::Installed)
            .filter_map(|m| verified.get(&m.id).map(|v| (v.verified_at, m)))
            .min_by_key(|(at, m)| (*at, m.id))
            .map(|(_, m)| m)
    }

    /// Claim, call, record. The claim is the exactly-once rule; see the module's text.
    async fn bootstrap_on(
        &self,
        cluster: &str,
        m: &Machine,
        ip: IpAddr,
        actor: &str,
    ) -> Result<BootstrapRecord, BootstrapError> {
        let node = self.node(cluster, ip, "bootstrap").await?;
        let claim = BootstrapRecord {
            cluster: cluster.to_string(),
            attempt_id: Uuid::new_v4(),
            machine_id: Some(m.id),
            node: m.display_name(),
            node_address: ip.to_string(),
            instance: self.settings.instance.clone(),
            requested_by: actor.to_string(),
            state: BootstrapState::Calling,
            claimed_at: Utc::now(),
            finished_at: None,
            detail: None,
        };
        let detail = serde_json::json!({
            "cluster": cluster, "node": claim.node, "address": claim.node_address,
            "instance": claim.instance, "attempt_id": claim.attempt_id,
        });
        if let Some(existing) = self
            .state
            .claim_bootstrap(
                &claim,
                &event(
                    Some(m.id),
                    "cluster.bootstrap_claimed",
                    actor,
                    detail.clone(),
                ),
            )
            .await
            .map_err(ServiceError::from)?
        {
            return Err(BootstrapError::Already(Box::new(existing)));
        }
        tracing::info!(cluster, node = %claim.node, address = %ip, actor, "bootstrap claimed; calling the node");
        let result = self.api.bootstrap(&node, BootstrapOptions::default()).await;
        let with = |extra: serde_json::Value| {
            let mut d = detail.clone();
            if let (Some(o), Some(e)) = (d.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            d
        };
        let now = Utc::now();
        let done = |text: String| {
            let claim = claim.clone();
            async move {
                self.state
                    .finish_bootstrap(
                        cluster,
                        claim.attempt_id,
                        BootstrapState::Done,
                        &text,
                        now,
                        &event(
                            Some(m.id),
                            "cluster.bootstrapped",
                            actor,
                            with(serde_json::json!({"result": text})),
                        ),
                    )
                    .await
                    .map_err(ServiceError::from)?;
                let mut r = claim.clone();
                r.state = BootstrapState::Done;
                r.finished_at = Some(now);
                r.detail = Some(text);
                Ok::<_, BootstrapError>(r)
            }
        };
        match result {
            Ok(()) => {
                tracing::info!(cluster, node = %claim.node, "bootstrapped");
                done("bootstrapped".into()).await
            }
            // The node's etcd already holds data: it was bootstrapped (or joined) before.
            Err(e) if e.is_refused(StatusCode::AlreadyExists) => {
                done(format!(
                    "the node's etcd was already initialised: {}",
                    e.cause
                ))
                .await
            }
            Err(e)
                if !e.request_sent
                    || matches!(
                        e.failure,
                        TalosApiFailure::Refused(
                            StatusCode::FailedPrecondition
                                | StatusCode::PermissionDenied
                                | StatusCode::Unimplemented
                                | StatusCode::Unauthenticated
                                | StatusCode::InvalidArgument
                        )
                    ) =>
            {
                self.state
                    .release_bootstrap(
                        cluster,
                        claim.attempt_id,
                        &event(
                            Some(m.id),
                            "cluster.bootstrap_refused",
                            actor,
                            with(serde_json::json!({"error": e.to_string()})),
                        ),
                    )
                    .await
                    .map_err(ServiceError::from)?;
                tracing::warn!(cluster, error = %e, "bootstrap refused by the node; claim released");
                Err(BootstrapError::Refused(e))
            }
            Err(e) => {
                self.events
                    .append_event(&event(
                        Some(m.id),
                        "cluster.bootstrap_unknown",
                        actor,
                        with(serde_json::json!({"error": e.to_string()})),
                    ))
                    .await
                    .map_err(ServiceError::from)?;
                tracing::error!(cluster, error = %e, "bootstrap outcome unknown; never retried automatically");
                Err(BootstrapError::Unknown(e))
            }
        }
    }

    /// Clusters whose bootstrap Plinth makes: `bootstrap: auto`, never claimed, with a verified
    /// installed control plane. Called by the workflow engine's tick; safe on several instances.
    pub async fn bootstrap_pending(&self) -> Result<(), ServiceError> {
        let sources = self.configs.sources().await?;
        let mut verified: Option<HashMap<MachineId, NodeVerification>> = None;
        for (name, rec) in &sources.clusters {
            if rec.spec.bootstrap.unwrap_or_default() != BootstrapMode::Auto {
                continue;
            }
            if self.state.cluster_bootstrap(name).await?.is_some() {
                continue;
            }
            if verified.is_none() {
                verified = Some(self.verifications().await?);
            }
            let verified = verified.as_ref().map_or_else(HashMap::new, Clone::clone);
            let machines = self.machines(name).await?;
            let Some(first) = self.first_control_plane(&machines, &verified) else {
                continue;
            };
            // Never bootstrap a cluster whose etcd already runs somewhere (bootstrapped by hand,
            // or before Plinth managed it): record it as found instead.
            if let Some((m, ip, members)) = self.running_etcd(name, &machines, &verified).await? {
                let now = Utc::now();
                let found = BootstrapRecord {
                    cluster: name.clone(),
                    attempt_id: Uuid::new_v4(),
                    machine_id: Some(m.id),
                    node: m.display_name(),
                    node_address: ip.to_string(),
                    instance: self.settings.instance.clone(),
                    requested_by: "plinth".into(),
                    state: BootstrapState::Found,
                    claimed_at: now,
                    finished_at: Some(now),
                    detail: Some(format!("etcd already runs with {members} member(s)")),
                };
                self.state
                    .claim_bootstrap(
                        &found,
                        &event(
                            Some(m.id),
                            "cluster.bootstrap_found",
                            "plinth",
                            serde_json::json!({"cluster": name, "node": found.node, "address": found.node_address, "members": members}),
                        ),
                    )
                    .await?;
                continue;
            }
            let Some(ip) = node_address(first, verified.get(&first.id)) else {
                continue;
            };
            match self.bootstrap_on(name, first, ip, "plinth").await {
                Ok(_) | Err(BootstrapError::Already(_)) => {}
                Err(BootstrapError::Service(e)) => return Err(e),
                Err(e) => {
                    tracing::warn!(cluster = %name, error = %e, "automatic bootstrap not made")
                }
            }
        }
        Ok(())
    }

    /// A control plane that reports etcd members: (machine, address, member count).
    async fn running_etcd<'a>(
        &self,
        cluster: &str,
        machines: &'a [Machine],
        verified: &HashMap<MachineId, NodeVerification>,
    ) -> Result<Option<(&'a Machine, IpAddr, usize)>, ServiceError> {
        for m in machines
            .iter()
            .filter(|m| m.role == Some(Role::ControlPlane))
        {
            let Some(ip) = node_address(m, verified.get(&m.id)) else {
                continue;
            };
            let node = self.node(cluster, ip, "etcd").await?;
            if let Ok(members) = self.api.etcd_members(&node).await {
                if !members.is_empty() {
                    return Ok(Some((m, ip, members.len())));
                }
            }
        }
        Ok(None)
    }

    /// A `talosconfig` for `cluster` with `role`, valid for `ttl` (endpoints and nodes: the
    /// control planes' addresses). Each one is an event naming who asked.
    pub async fn talosconfig(
        &self,
        cluster: &str,
        role: &str,
        ttl: Duration,
        actor: &str,
    ) -> Result<String, ServiceError> {
        let (os, _) = self.cas(cluster).await?;
        let machines = self.machines(cluster).await?;
        let verified = self.verifications().await?;
        let cps: Vec<String> = machines
            .iter()
            .filter(|m| m.role == Some(Role::ControlPlane))
            .filter_map(|m| node_address(m, verified.get(&m.id)).map(|a| a.to_string()))
            .collect();
        let nodes: Vec<String> = machines
            .iter()
            .filter_map(|m| node_address(m, verified.get(&m.id)).map(|a| a.to_string()))
            .collect();
        let cert = pki::talos_client_cert(&os, role, Utc::now(), ttl).map_err(|e| match e {
            pki::PkiError::Role(_) => ServiceError::Invalid(crate::domain::ValidationErrors(vec![
                crate::domain::validate::FieldError::new("role", e.to_string()),
            ])),
            other => ServiceError::Config(MachineConfigError::Secrets(other.to_string())),
        })?;
        let text = pki::talosconfig(cluster, &cps, &nodes, &cert)
            .map_err(|e| ServiceError::Config(MachineConfigError::Secrets(e.to_string())))?;
        self.events.append_event(&event(
                None,
                "cluster.talosconfig",
                actor,
                serde_json::json!({"cluster": cluster, "role": role, "expires_at": cert.not_after, "endpoints": cps}),
            ))
            .await?;
        Ok(text)
    }

    /// An admin `kubeconfig` for `cluster`, valid for `ttl`, for the cluster's endpoint. An event
    /// names who asked.
    pub async fn kubeconfig(
        &self,
        cluster: &str,
        ttl: Duration,
        actor: &str,
    ) -> Result<String, ServiceError> {
        let (_, k8s) = self.cas(cluster).await?;
        let sources = self.configs.sources().await?;
        let endpoint = sources
            .clusters
            .get(cluster)
            .map(|c| c.spec.endpoint.clone())
            .ok_or_else(|| ServiceError::NotFound(format!("cluster {cluster}")))?;
        let cert = pki::kubernetes_admin_cert(&k8s, Utc::now(), ttl)
            .map_err(|e| ServiceError::Config(MachineConfigError::Secrets(e.to_string())))?;
        let text = pki::kubeconfig(cluster, &endpoint, &cert)
            .map_err(|e| ServiceError::Config(MachineConfigError::Secrets(e.to_string())))?;
        self.events.append_event(&event(
                None,
                "cluster.kubeconfig",
                actor,
                serde_json::json!({"cluster": cluster, "expires_at": cert.not_after, "endpoint": endpoint}),
            ))
            .await?;
        Ok(text)
    }

    /// Measure `cluster`'s health now and store it.
    pub async fn measure(&self, cluster: &str) -> Result<ClusterHealth, ServiceError> {
        self.declared_version(cluster).await?;
        let machines = self.machines(cluster).await?;
        let verified = self.verifications().await?;
        let mut nodes = Vec::new();
        let mut members: Option<Vec<EtcdMember>> = None;
        let mut leader: Option<u64> = None;
        let mut healthy_etcd: Vec<u64> = Vec::new();
        let mut cp_addrs = Vec::new();
        let mut worker_addrs = Vec::new();
        let mut checker: Option<IpAddr> = None;
        for m in &machines {
            let addr = node_address(m, verified.get(&m.id));
            let mut h = NodeHealth {
                machine: m.display_name(),
                machine_id: m.id,
                role: m.role,
                state: m.state,
                address: addr.map(|a| a.to_string()),
                apid: false,
                talos_version: None,
                services: Vec::new(),
                etcd_member_id: None,
                error: None,
            };
            let Some(ip) = addr else {
                h.error = Some("no known address".into());
                nodes.push(h);
                continue;
            };
            if m.state != LifecycleState::Installed {
                h.error = Some(format!("the machine is {}", m.state));
                nodes.push(h);
                continue;
            }
            match m.role {
                Some(Role::ControlPlane) => cp_addrs.push(ip.to_string()),
                _ => worker_addrs.push(ip.to_string()),
            }
            let node = self.node(cluster, ip, "health").await?;
            match self.api.version(&node).await {
                Ok(v) => {
                    h.apid = true;
                    h.talos_version = Some(v.tag);
                }
                Err(e) => {
                    h.error = Some(e.to_string());
                    nodes.push(h);
                    continue;
                }
            }
            match self.api.services(&node).await {
                Ok(s) => {
                    h.services = s
                        .into_iter()
                        .filter(|s| ["etcd", "kubelet", "apid", "trustd"].contains(&s.id.as_str()))
                        .collect()
                }
                Err(e) => h.error = Some(e.to_string()),
            }
            if m.role == Some(Role::ControlPlane) {
                let etcd_ok = h
                    .services
                    .iter()
                    .any(|s| s.id == "etcd" && s.state == "Running" && s.healthy == Some(true));
                if etcd_ok {
                    if let Ok(st) = self.api.etcd_status(&node).await {
                        h.etcd_member_id = Some(st.member_id);
                        healthy_etcd.push(st.member_id);
                        if st.leader != 0 {
                            leader.get_or_insert(st.leader);
                        }
                        checker.get_or_insert(ip);
                    }
                    if members.is_none() {
                        if let Ok(list) = self.api.etcd_members(&node).await {
                            members = Some(list);
                        }
                    }
                }
            }
            nodes.push(h);
        }
        let nodes_up = nodes.iter().filter(|n| n.apid).count() as u32;
        let etcd = members.map(|members| {
            let total = members.len() as u32;
            let healthy = members
                .iter()
                .filter(|m| healthy_etcd.contains(&m.id))
                .count() as u32;
            let quorum = total / 2 + 1;
            EtcdHealth {
                leader_hostname: leader
                    .and_then(|l| members.iter().find(|m| m.id == l))
                    .map(|m| m.hostname.clone()),
                members,
                leader,
                healthy_members: healthy,
                quorum,
                quorum_margin: i64::from(healthy) - i64::from(quorum),
            }
        });
        let talos_check = match checker {
            Some(ip) => {
                let node = self.node(cluster, ip, "health").await?;
                let which = ClusterNodes {
                    control_planes: cp_addrs,
                    workers: worker_addrs,
                };
                Some(
                    match self
                        .api
                        .cluster_health(&node, &which, self.settings.health_wait)
                        .await
                    {
                        Ok(c) => c,
                        Err(e) => ClusterCheck {
                            passed: false,
                            progress: Vec::new(),
                            error: Some(e.to_string()),
                        },
                    },
                )
            }
            None => None,
        };
        let mut bootstrap = self.state.cluster_bootstrap(cluster).await?;
        // A claim of unknown outcome whose node now runs etcd: it happened.
        if let Some(b) = &bootstrap {
            if b.state == BootstrapState::Calling {
                let member = nodes.iter().any(|n| {
                    n.address.as_deref() == Some(b.node_address.as_str())
                        && n.etcd_member_id.is_some()
                });
                if member {
                    let now = Utc::now();
                    let text = "etcd found running on the node after the call";
                    if self
                        .state
                        .finish_bootstrap(
                            cluster,
                            b.attempt_id,
                            BootstrapState::Done,
                            text,
                            now,
                            &event(
                                b.machine_id,
                                "cluster.bootstrapped",
                                "plinth",
                                serde_json::json!({"cluster": cluster, "node": b.node, "address": b.node_address, "result": text}),
                            ),
                        )
                        .await?
                    {
                        bootstrap = self.state.cluster_bootstrap(cluster).await?;
                    }
                }
            }
        }
        let health = ClusterHealth {
            cluster: cluster.to_string(),
            checked_at: Utc::now(),
            nodes,
            nodes_up,
            etcd,
            talos_check,
            bootstrap,
        };
        let json = serde_json::to_string(&health)
            .map_err(|e| ServiceError::Store(super::ports::StoreError::Backend(e.to_string())))?;
        self.state
            .put_health(cluster, &json, health.checked_at)
            .await?;
        let label = ClusterLabel {
            cluster: cluster.to_string(),
        };
        self.gauges
            .nodes_up
            .get_or_create(&label)
            .set(i64::from(health.nodes_up));
        if let Some(e) = &health.etcd {
            self.gauges
                .etcd_healthy
                .get_or_create(&label)
                .set(i64::from(e.healthy_members));
            self.gauges
                .quorum_margin
                .get_or_create(&label)
                .set(e.quorum_margin);
        }
        Ok(health)
    }

    /// The last stored health of `cluster`, if any.
    pub async fn last_health(&self, cluster: &str) -> Result<Option<ClusterHealth>, ServiceError> {
        Ok(self
            .state
            .cluster_health(cluster)
            .await?
            .and_then(|(json, _)| serde_json::from_str(&json).ok()))
    }

    /// Every machine of `cluster` with the address of its Talos API (its verified address, else
    /// its first reserved one), in host-name order.
    pub async fn cluster_nodes(
        &self,
        cluster: &str,
    ) -> Result<Vec<(Machine, Option<IpAddr>)>, ServiceError> {
        let machines = self.machines(cluster).await?;
        let verified = self.verifications().await?;
        let mut out: Vec<(Machine, Option<IpAddr>)> = machines
            .into_iter()
            .map(|m| {
                let a = node_address(&m, verified.get(&m.id));
                (m, a)
            })
            .collect();
        out.sort_by_key(|a| a.0.display_name());
        Ok(out)
    }

    /// `cluster`'s node at `ip`, reached with a client certificate of `role`.
    pub async fn talos_node(
        &self,
        cluster: &str,
        ip: IpAddr,
        role: &str,
    ) -> Result<TalosNode, ServiceError> {
        Ok(TalosNode {
            endpoint: SocketAddr::new(ip, self.settings.talos_api_port),
            credentials: self.credentials(cluster, role).await?,
        })
    }

    /// The Talos API client.
    pub fn api(&self) -> Arc<dyn TalosApi> {
        self.api.clone()
    }

    /// The declared spec of `cluster`.
    pub async fn spec(&self, cluster: &str) -> Result<super::ports::ClusterSpec, ServiceError> {
        let sources = self.configs.sources().await?;
        sources
            .clusters
            .get(cluster)
            .map(|c| c.spec.clone())
            .ok_or_else(|| ServiceError::NotFound(format!("cluster {cluster}")))
    }

    /// Record what an upgraded node reported (its new version and certificate), as a verified
    /// install is recorded, with its event.
    pub async fn record_upgraded(
        &self,
        cluster: &str,
        machine: MachineId,
        address: &str,
        v: &super::ports::talos_api::NodeVersion,
    ) -> Result<(), ServiceError> {
        let rec = NodeVerification {
            machine_id: machine,
            address: address.to_string(),
            talos_version: v.tag.clone(),
            cert_sha256: v.cert_sha256.clone(),
            verified_at: Utc::now(),
        };
        self.state
            .record_verification(
                &rec,
                &event(
                    Some(machine),
                    "talos.verified",
                    "plinth",
                    serde_json::json!({
                        "cluster": cluster, "address": rec.address, "talos_version": v.tag,
                        "cert_sha256": v.cert_sha256, "arch": v.arch, "platform": v.platform,
                        "after": "upgrade",
                    }),
                ),
            )
            .await?;
        Ok(())
    }

    /// Every declared cluster's name.
    pub async fn names(&self) -> Result<Vec<String>, ServiceError> {
        let mut names: Vec<String> = self.configs.sources().await?.clusters.into_keys().collect();
        names.sort();
        Ok(names)
    }
}

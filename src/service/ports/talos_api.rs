//! The `talos api` port: what the use cases ask of a node's Talos API (apid, TCP 50000), and
//! what they get back, in plain types. `crate::talos_api` implements it over gRPC with mutual
//! TLS; the integration tests run it against a Talos API service of their own.
//!
//! Every call names one node by address and carries the credentials to reach it: the cluster's
//! OS CA (which the node's certificate must chain to) and a short-lived client certificate with
//! a Talos role (see `crate::talos::pki`). Errors name the node, the call and the cause, and say
//! what kind of failure it was, so a caller can tell "not up yet" from "not our node" from "the
//! node refused".
//!
//! Day two (#20): upgrades are `MachineService.Upgrade` (Talos before 1.13: the node pulls the
//! installer, installs it into its other boot slot and reboots by itself) or, from 1.13,
//! `ImageService.Pull` + `LifecycleService.Upgrade` (the installer's progress and exit code) +
//! `MachineService.Reboot`; a reboot is told by the node's boot id (`Read` of
//! `/proc/sys/kernel/random/boot_id`, as talosctl does). etcd snapshots and recovery
//! (`EtcdSnapshot`, `EtcdRecover`, `Bootstrap` with `recover_etcd`) are further methods over the
//! same node and credential types. Imports nothing but std, chrono, serde and futures (the
//! streams of snapshots).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a client presents to a node, and what it trusts the node by. The key never appears in
/// `Debug` and is never written anywhere by the port.
#[derive(Clone)]
pub struct TalosCredentials {
    /// The cluster's Talos OS CA certificate, PEM: the node's certificate must chain to it.
    pub ca_pem: String,
    /// The client certificate, PEM, signed by the same CA, role in its Organization.
    pub cert_pem: String,
    /// Its private key, PKCS#8 PEM.
    pub key_pem: String,
    /// The role (`os:admin`, `os:reader`, ...), for messages.
    pub role: String,
    /// When the client certificate expires.
    pub expires_at: DateTime<Utc>,
}

impl fmt::Debug for TalosCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TalosCredentials")
            .field("role", &self.role)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// One node's Talos API, and how to talk to it.
#[derive(Clone, Debug)]
pub struct TalosNode {
    /// The node's address and apid port.
    pub endpoint: SocketAddr,
    /// Credentials.
    pub credentials: Arc<TalosCredentials>,
}

impl fmt::Display for TalosNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.endpoint)
    }
}

/// What `Version` reports, with the certificate the node presented.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeVersion {
    /// Talos version tag, `v1.11.6`.
    pub tag: String,
    /// Git commit of the build.
    pub sha: String,
    /// CPU architecture, `amd64`.
    pub arch: String,
    /// Platform (`metal`, ...).
    pub platform: String,
    /// SHA-256 (hex) of the DER of the node's server certificate (verified against the OS CA).
    pub cert_sha256: String,
}

/// One system service of a node (`ServiceList`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ServiceStatus {
    /// Service id: `etcd`, `kubelet`, `apid`, `trustd`, ...
    pub id: String,
    /// Talos' state word: `Running`, `Preparing`, `Waiting`, `Finished`, `Failed`, ...
    pub state: String,
    /// Health: `None` while no health check has run.
    pub healthy: Option<bool>,
    /// The last health message.
    pub message: String,
}

/// One etcd member (`EtcdMemberList`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EtcdMember {
    /// Member id.
    pub id: u64,
    /// The member's host name.
    pub hostname: String,
    /// Peer URLs.
    pub peer_urls: Vec<String>,
    /// Client URLs.
    pub client_urls: Vec<String>,
    /// A learner (not yet voting).
    pub is_learner: bool,
}

/// The local etcd member's status (`EtcdStatus`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EtcdMemberStatus {
    /// This member's id.
    pub member_id: u64,
    /// The leader's member id as this member sees it (0: no leader).
    pub leader: u64,
    /// Raft index.
    pub raft_index: u64,
    /// Raft term.
    pub raft_term: u64,
    /// Database size, bytes.
    pub db_size: i64,
    /// Errors etcd reports (alarms).
    pub errors: Vec<String>,
    /// A learner.
    pub is_learner: bool,
}

/// Which nodes a cluster health check covers (addresses as the node sees them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterNodes {
    /// Control-plane node addresses.
    pub control_planes: Vec<String>,
    /// Worker node addresses.
    pub workers: Vec<String>,
}

/// The outcome of Talos' own cluster health check (`ClusterService.HealthCheck`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterCheck {
    /// Every check passed within the wait.
    pub passed: bool,
    /// The progress lines, in order (`waiting for etcd to be healthy: OK`, ...).
    pub progress: Vec<String>,
    /// Why it did not pass (the stream's final error), if it did not.
    pub error: Option<String>,
}

/// Options of `Bootstrap`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BootstrapOptions {
    /// Seed etcd from a snapshot uploaded with `EtcdRecover` (recovery, #20).
    pub recover_etcd: bool,
    /// Skip the snapshot's hash check (a copied data directory).
    pub recover_skip_hash_check: bool,
}

/// What the installer reported through `LifecycleService.Upgrade`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallOutcome {
    /// The installer's exit code (0: installed into the other boot slot).
    pub exit_code: i32,
    /// Its last progress lines (at most [`INSTALL_LINES`]).
    pub messages: Vec<String>,
}

/// Progress lines an [`InstallOutcome`] keeps (the last ones).
pub const INSTALL_LINES: usize = 20;

/// A gRPC status code, as Talos answers with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusCode {
    /// 1.
    Cancelled,
    /// 2.
    Unknown,
    /// 3.
    InvalidArgument,
    /// 4.
    DeadlineExceeded,
    /// 5.
    NotFound,
    /// 6: e.g. Bootstrap on a node whose etcd data directory is not empty.
    AlreadyExists,
    /// 7: the role of the client certificate does not allow the call.
    PermissionDenied,
    /// 8.
    ResourceExhausted,
    /// 9: e.g. Bootstrap before the node is ready for it, or on a worker.
    FailedPrecondition,
    /// 10.
    Aborted,
    /// 11.
    OutOfRange,
    /// 12: e.g. a control-plane-only call on a worker.
    Unimplemented,
    /// 13.
    Internal,
    /// 14.
    Unavailable,
    /// 15.
    DataLoss,
    /// 16.
    Unauthenticated,
}

impl fmt::Display for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        f.write_str(&s)
    }
}

/// What kind of failure a call met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TalosApiFailure {
    /// Nothing answered, or the connection broke: the node may not be up yet.
    Unreachable,
    /// The node answered with a certificate that does not chain to the cluster's OS CA (or is
    /// not valid for its address): not our node, or not running our config.
    Untrusted,
    /// The call took longer than its timeout.
    Timeout,
    /// The node answered the call with an error status.
    Refused(StatusCode),
    /// The answer did not make sense (no message, a per-node error in the metadata).
    Malformed,
}

/// A failed call: which node, which call, what happened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Talos API {call} on {node}: {cause}")]
pub struct TalosApiError {
    /// The node (address and port).
    pub node: String,
    /// The call, `machine.MachineService/Version`.
    pub call: &'static str,
    /// What kind of failure.
    pub failure: TalosApiFailure,
    /// The cause, in words.
    pub cause: String,
    /// Whether the request may have reached the node (false: the connection failed first).
    pub request_sent: bool,
}

impl TalosApiError {
    /// The node refused with this status code.
    pub fn is_refused(&self, code: StatusCode) -> bool {
        self.failure == TalosApiFailure::Refused(code)
    }
}

/// A node's Talos API.
#[async_trait]
pub trait TalosApi: Send + Sync + 'static {
    /// `MachineService.Version`: the version the node runs and the certificate it presented.
    async fn version(&self, node: &TalosNode) -> Result<NodeVersion, TalosApiError>;

    /// `MachineService.Bootstrap`. Never retried by the port once the request may have been
    /// sent: whether to try again is the caller's decision.
    async fn bootstrap(
        &self,
        node: &TalosNode,
        options: BootstrapOptions,
    ) -> Result<(), TalosApiError>;

    /// `MachineService.ServiceList`.
    async fn services(&self, node: &TalosNode) -> Result<Vec<ServiceStatus>, TalosApiError>;

    /// `MachineService.EtcdMemberList` (the cluster's members as the node's etcd sees them).
    async fn etcd_members(&self, node: &TalosNode) -> Result<Vec<EtcdMember>, TalosApiError>;

    /// `MachineService.EtcdStatus` (the local member, with the leader it sees).
    async fn etcd_status(&self, node: &TalosNode) -> Result<EtcdMemberStatus, TalosApiError>;

    /// `ClusterService.HealthCheck` run by `node` over `nodes`, waiting at most `wait`.
    async fn cluster_health(
        &self,
        node: &TalosNode,
        nodes: &ClusterNodes,
        wait: Duration,
    ) -> Result<ClusterCheck, TalosApiError>;

    /// The node's boot id (`MachineService.Read` of `/proc/sys/kernel/random/boot_id`; needs
    /// `os:admin`): it changes with every boot.
    async fn boot_id(&self, node: &TalosNode) -> Result<String, TalosApiError>;

    /// `MachineService.Upgrade` (Talos before 1.13; deprecated from 1.13): the node pulls and
    /// checks `image`, on a control plane checks etcd, acknowledges, then installs and reboots by
    /// itself. Returns the acknowledgement. Never retried once the request may have been sent.
    async fn upgrade_legacy(&self, node: &TalosNode, image: &str) -> Result<String, TalosApiError>;

    /// `ImageService.Pull` into the system containerd (Talos 1.13 and later), waiting at most
    /// `wait`: the pulled image's name.
    async fn pull_image(
        &self,
        node: &TalosNode,
        image: &str,
        wait: Duration,
    ) -> Result<String, TalosApiError>;

    /// `LifecycleService.Upgrade` with an image pulled before (Talos 1.13 and later), waiting at
    /// most `wait` for the installer's exit code. Does not reboot. Never retried once sent.
    async fn lifecycle_upgrade(
        &self,
        node: &TalosNode,
        image: &str,
        wait: Duration,
    ) -> Result<InstallOutcome, TalosApiError>;

    /// `MachineService.Reboot`. Never retried once the request may have been sent.
    async fn reboot(&self, node: &TalosNode) -> Result<(), TalosApiError>;
    /// `MachineService.EtcdSnapshot`: the node's etcd snapshot as it streams (control planes
    /// only). Each item is the next bytes; a stalled or broken stream ends with an error.
    async fn etcd_snapshot(&self, node: &TalosNode) -> Result<SnapshotStream, TalosApiError>;

    /// `MachineService.EtcdRecover`: upload a snapshot for a later `Bootstrap` with
    /// `recover_etcd`. An `Err` item abandons the upload (the call is cancelled, so the node never
    /// sees a complete upload). Never retried: the stream is consumed.
    async fn etcd_recover(
        &self,
        node: &TalosNode,
        upload: UploadStream,
    ) -> Result<(), TalosApiError>;
}

/// The bytes of an etcd snapshot as a node streams them.
pub type SnapshotStream = futures::stream::BoxStream<'static, Result<Vec<u8>, TalosApiError>>;

/// The bytes of a snapshot to upload; an `Err` (why) abandons the upload.
pub type UploadStream = futures::stream::BoxStream<'static, Result<Vec<u8>, String>>;

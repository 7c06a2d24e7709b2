//! The Talos API service of the tests: a tonic server speaking Talos' protos (Plinth's generated
//! `talos_api::proto`, written from Talos' definitions) over mutual TLS, with the behaviour of a
//! Talos node's apid and machined for the calls Plinth makes:
//!
//! - its server certificate is signed here from the OS CA found in the machine config it was
//!   served (`machine.ca`), for its own addresses, as a node does (`--foreign` signs it with a CA
//!   of its own instead: any process listening on 50000);
//! - clients must present a certificate chained to that CA whose extended key usage is client
//!   auth only; the role in its Organization is checked per method with Talos' rules (a reader
//!   cannot bootstrap: PERMISSION_DENIED "not authorized");
//! - `Version` reports the Talos version of the installer image in the config (or a forced one);
//! - `Bootstrap` on a control plane with an empty etcd data directory starts etcd with this node
//!   as the only member; a second call is refused ALREADY_EXISTS "etcd data directory is not
//!   empty", on a worker FAILED_PRECONDITION, and before the node is ready FAILED_PRECONDITION
//!   "bootstrap is not available yet";
//! - `ServiceList`, `EtcdMemberList`, `EtcdStatus` and `ClusterService.HealthCheck` answer from
//!   the state of an etcd cluster shared by the nodes of one test (control planes join it once it
//!   is bootstrapped, as Talos' etcd service does);
//! - upgrades as Talos does them (see `Api::upgrade` and the lifecycle service): before 1.13
//!   `MachineService.Upgrade` pulls and checks the installer, on a control plane refuses unless
//!   every etcd member is healthy (and there are not two), acknowledges, then installs and
//!   reboots by itself; from 1.13 `ImageService.Pull` + `LifecycleService.Upgrade` (progress
//!   lines, an exit code, the image must have been pulled, no reboot) + `MachineService.Reboot`
//!   (nodes before 1.13 answer UNIMPLEMENTED there, as they do not serve those services). A
//!   reboot takes the node down for `reboot_ms` (connections refused, its etcd member down,
//!   leadership moves), then it comes back with a new boot id (`Read` of
//!   `/proc/sys/kernel/random/boot_id`) on the new version; an upgrade fault makes the installer
//!   fail, the node never come back, come back on its previous version (Talos' A/B fallback) or
//!   with an unhealthy kubelet. The shared `ClusterState` records every node going down and
//!   coming up, and the most control planes down at once;
//! - faults on demand: an error status or a delay for the next N calls of a method.
//!
//! Run in-process (`TalosNode::start`) on loopback addresses, or as a process of its own (the test
//! binary re-executed with [`NODE_ENV`] naming a JSON spec), e.g. inside the VM of the reinstall
//! test where `/init` starts it with the config it fetched.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine as _;
use plinth::talos_api::proto::{cluster, common, machine};
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use sha2::Digest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

use cluster::cluster_service_server::{ClusterService, ClusterServiceServer};
use machine::image_service_server::{ImageService, ImageServiceServer};
use machine::lifecycle_service_server::{LifecycleService, LifecycleServiceServer};
use machine::machine_service_server::{MachineService, MachineServiceServer};

/// Names a JSON [`ProcessSpec`] when the test binary is re-executed as a node (through
/// `support::reexec`).
pub const NODE_ENV: &str = "PLINTH_TEST_TALOS_NODE";

/// Talos' rules for the methods served here (machined's authorizer): which roles may call.
fn allowed(method: &str) -> &'static [&'static str] {
    const READ: &[&str] = &["os:admin", "os:operator", "os:reader"];
    const ETCD_READ: &[&str] = &["os:admin", "os:operator", "os:reader", "os:etcd:backup"];
    match method {
        "/machine.MachineService/Bootstrap"
        | "/machine.MachineService/Upgrade"
        | "/machine.MachineService/Read"
        | "/machine.LifecycleService/Upgrade" => &["os:admin"],
        "/machine.MachineService/Reboot" | "/machine.ImageService/Pull" => {
            &["os:admin", "os:operator"]
        }
        "/machine.MachineService/EtcdMemberList" | "/machine.MachineService/EtcdStatus" => {
            ETCD_READ
        }
        // Talos: a snapshot for admins, operators and etcd backups (not readers); a recovery
        // upload for admins.
        "/machine.MachineService/EtcdSnapshot" => &["os:admin", "os:operator", "os:etcd:backup"],
        "/machine.MachineService/EtcdRecover" => &["os:admin"],
        _ => READ,
    }
}

/// What a node takes from the machine config it was served.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// `controlplane` or `worker`.
    pub machine_type: String,
    /// OS CA certificate and key, PEM.
    pub ca_crt: String,
    pub ca_key: String,
    /// Host name (machine.network.hostname, or a HostnameConfig document).
    pub hostname: String,
    /// The installer image's tag, `v1.11.6`.
    pub version: String,
}

fn b64_pem(v: &serde_yaml_ng::Value) -> String {
    let s = v.as_str().unwrap_or_default();
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(s.trim())
            .unwrap_or_default(),
    )
    .unwrap_or_default()
}

impl NodeConfig {
    /// From a (multi-document) Talos machine config.
    pub fn from_machine_config(yaml: &str) -> NodeConfig {
        let mut cfg = NodeConfig {
            machine_type: String::new(),
            ca_crt: String::new(),
            ca_key: String::new(),
            hostname: String::new(),
            version: String::new(),
        };
        for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
            // A document that does not parse ends the stream (the iterator would repeat it).
            let Ok(v) = serde_yaml_ng::Value::deserialize(doc) else {
                break;
            };
            if let Some(m) = v.get("machine") {
                cfg.machine_type = m["type"].as_str().unwrap_or_default().to_string();
                cfg.ca_crt = b64_pem(&m["ca"]["crt"]);
                cfg.ca_key = b64_pem(&m["ca"]["key"]);
                if let Some(h) = m["network"]["hostname"].as_str() {
                    cfg.hostname = h.to_string();
                }
                if let Some(img) = m["install"]["image"].as_str() {
                    cfg.version = img.rsplit(':').next().unwrap_or_default().to_string();
                }
            }
            if v["kind"].as_str() == Some("HostnameConfig") {
                if let Some(h) = v["hostname"].as_str() {
                    cfg.hostname = h.to_string();
                }
            }
        }
        assert!(
            !cfg.ca_crt.is_empty(),
            "the machine config has no machine.ca"
        );
        cfg
    }

    fn is_control_plane(&self) -> bool {
        self.machine_type == "controlplane" || self.machine_type == "init"
    }
}

/// One etcd member of the shared cluster.
#[derive(Clone, Debug)]
pub struct Member {
    pub id: u64,
    pub hostname: String,
    pub ip: IpAddr,
}

/// The etcd cluster and the nodes of one test.
#[derive(Debug, Default)]
pub struct ClusterState {
    pub members: Vec<Member>,
    pub leader: u64,
    /// Nodes up, by address: (control plane?, host name).
    pub nodes: HashMap<IpAddr, (bool, String)>,
    /// The OS CA key a control plane's trustd signs workers' certificates with.
    pub trustd_key: Option<String>,
    /// Nodes down (rebooting), by address.
    pub down: std::collections::HashSet<IpAddr>,
    /// The most control planes down at one moment.
    pub max_cps_down: usize,
    /// Every node going down and coming up, in order: `down cp-1`, `up cp-1 v1.13.9`.
    pub timeline: Vec<String>,
    /// etcd's newest revision (what a snapshot holds); 0 means 1000000.
    pub revision: u64,
    /// Flip a byte of every snapshot streamed after etcd's trailer was computed (a corrupted
    /// stream, which Plinth must refuse).
    pub snapshot_corrupt: bool,
    /// Snapshots streamed by any node: SHA-256 (hex) -> revision.
    pub served: HashMap<String, u64>,
    /// While set, a snapshot stream stops once it sent `hold_after` bytes (at least its first
    /// chunk) and a recovery upload waits before reading (what a slow etcd or a slow link looks
    /// like), each for at most two minutes.
    pub hold: bool,
    /// Bytes a snapshot stream sends before `hold` stops it.
    pub hold_after: u64,
    /// Snapshot streams that reached `hold_after` bytes, by any node.
    pub snapshots_begun: u32,
    next_id: u64,
}

/// Wait while `cluster.hold` is set (bounded: two minutes).
async fn held(cluster: &SharedCluster) {
    for _ in 0..6000 {
        if !cluster.lock().expect("cluster").hold {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

impl ClusterState {
    /// The newest revision.
    pub fn revision(&self) -> u64 {
        if self.revision == 0 {
            1_000_000
        } else {
            self.revision
        }
    }
}

pub type SharedCluster = Arc<Mutex<ClusterState>>;

/// A fault for the next `times` calls of a method.
#[derive(Clone, Debug)]
pub struct Fault {
    pub status: Option<(Code, String)>,
    pub delay: Option<Duration>,
    pub times: u32,
}

/// What the node saw and did.
#[derive(Debug, Default)]
pub struct NodeRecord {
    /// Every call: (method, roles of the caller).
    pub calls: Vec<(String, Vec<String>)>,
    /// Bootstraps that started etcd.
    pub bootstraps: u32,
    /// Bootstrap calls refused.
    pub bootstrap_refusals: Vec<String>,
    /// TLS handshakes refused (client not trusted).
    pub rejected_handshakes: u32,
    /// Upgrade calls taken: (call, image).
    pub upgrades: Vec<(String, String)>,
    /// Snapshots streamed whole: (bytes, SHA-256 hex).
    pub snapshots: Vec<(u64, String)>,
    /// Recovery uploads received whole: (bytes, SHA-256 hex, etcd's trailer matched).
    pub recover_uploads: Vec<(u64, String, bool)>,
    /// Recovery uploads cut off before their end.
    pub recover_aborted: u32,
    /// Bootstraps that restored etcd from an uploaded snapshot: its SHA-256.
    pub recovered_from: Vec<String>,
}

/// Options of a node.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeOptions {
    /// Report this version instead of the installer image's.
    #[serde(default)]
    pub version: Option<String>,
    /// Sign the server certificate with a CA of its own, not the cluster's.
    #[serde(default)]
    pub foreign: bool,
    /// `Bootstrap` is "not available yet" for this long after start.
    #[serde(default)]
    pub bootstrap_after_ms: u64,
    /// Host name when the config sets none.
    #[serde(default)]
    pub hostname: Option<String>,
    /// For a worker with no control plane in the test: the OS CA key (PEM) the cluster's trustd
    /// would sign its certificate with.
    #[serde(default)]
    pub trustd_key: Option<String>,
    /// How long a reboot keeps the node down.
    #[serde(default)]
    pub reboot_ms: u64,
    /// What goes wrong with an upgrade of this node.
    #[serde(default)]
    pub upgrade_fault: Option<UpgradeFault>,
    /// Bytes of the etcd snapshot this node streams (default 1 MiB).
    #[serde(default)]
    pub snapshot_bytes: Option<u64>,
}

/// What goes wrong with an upgrade.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpgradeFault {
    /// The installer exits with this code (`LifecycleService.Upgrade`); before 1.13 the node
    /// reboots on its old version, as Talos does when the install fails.
    InstallerExit(i32),
    /// The node goes down for its reboot and never comes back.
    NeverBack,
    /// The new version does not come up: the node comes back on its previous one.
    Rollback,
    /// The node comes back on the new version with kubelet unhealthy.
    KubeletUnhealthy,
}

/// The OS CA key of a secrets bundle file (PEM), for [`NodeOptions::trustd_key`].
pub fn trustd_key_of_bundle(path: &std::path::Path) -> String {
    let b = plinth::talos::secrets::SecretsBundle::parse(
        &std::fs::read_to_string(path).expect("bundle"),
    )
    .expect("bundle parses");
    b64_pem(&serde_yaml_ng::Value::String(b.certs.os.key))
}

struct Node {
    cfg: NodeConfig,
    opts: NodeOptions,
    ip: IpAddr,
    member_id: Mutex<Option<u64>>,
    /// The etcd data directory holds data (bootstrapped or joined).
    etcd_data: Mutex<bool>,
    /// The last complete recovery upload: (bytes, SHA-256 hex, etcd's trailer matched).
    upload: Mutex<Option<(u64, String, bool)>>,
    cluster: SharedCluster,
    faults: Mutex<HashMap<String, Fault>>,
    record: Mutex<NodeRecord>,
    started: Instant,
    /// The version it runs now.
    version: Mutex<String>,
    /// This boot's id.
    boot_id: Mutex<String>,
    /// Down (rebooting, or never coming back).
    down: std::sync::atomic::AtomicBool,
    /// Images pulled into its system containerd.
    pulled: Mutex<std::collections::HashSet<String>>,
    /// The version installed into the other boot slot, booted at the next reboot.
    staged: Mutex<Option<String>>,
    /// An upgrade or install in progress.
    installing: std::sync::atomic::AtomicBool,
    /// The upgrade fault, settable while it runs.
    upgrade_fault: Mutex<Option<UpgradeFault>>,
}

/// Roles of the TLS peer, put into each request by the connection.
#[derive(Clone, Debug)]
pub struct Peer {
    pub roles: Vec<String>,
}

impl Node {
    /// Talos' etcd service: a control plane joins a bootstrapped cluster on its own.
    fn sync_etcd(&self) {
        if !self.cfg.is_control_plane() {
            return;
        }
        let mut c = self.cluster.lock().expect("cluster");
        let mut mine = self.member_id.lock().expect("member");
        if mine.is_none() && !c.members.is_empty() {
            // As Talos' etcd service does before joining with an empty data directory: a member
            // of the same host name (this node before a reinstall) is removed first.
            let name = self.cfg.hostname.clone();
            c.members.retain(|m| m.hostname != name);
            c.next_id += 1;
            let id = 0x1000 + c.next_id;
            c.members.push(Member {
                id,
                hostname: self.cfg.hostname.clone(),
                ip: self.ip,
            });
            *mine = Some(id);
            *self.etcd_data.lock().expect("data") = true;
        }
    }

    async fn enter<T>(&self, req: &Request<T>, method: &str) -> Result<(), Status> {
        let roles = req
            .extensions()
            .get::<Peer>()
            .map(|p| p.roles.clone())
            .unwrap_or_default();
        self.record
            .lock()
            .expect("record")
            .calls
            .push((method.to_string(), roles.clone()));
        if self.is_down() {
            return Err(Status::unavailable("the node is rebooting"));
        }
        if !roles.iter().any(|r| allowed(method).contains(&r.as_str())) {
            return Err(Status::permission_denied("not authorized"));
        }
        let fault = {
            let mut faults = self.faults.lock().expect("faults");
            let short = method.rsplit('/').next().unwrap_or(method).to_string();
            match faults.get_mut(&short) {
                Some(f) if f.times > 0 => {
                    f.times -= 1;
                    Some(f.clone())
                }
                _ => None,
            }
        };
        if let Some(f) = fault {
            if let Some(d) = f.delay {
                tokio::time::sleep(d).await;
            }
            if let Some((code, msg)) = f.status {
                return Err(Status::new(code, msg));
            }
        }
        self.sync_etcd();
        Ok(())
    }

    fn etcd_running(&self) -> bool {
        self.member_id.lock().expect("member").is_some()
    }

    fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn running_version(&self) -> String {
        self.version.lock().expect("version").clone()
    }

    /// Talos 1.13 or later (serves the image and lifecycle services).
    fn has_lifecycle(&self) -> bool {
        plinth::service::upgrade::method_for(&self.running_version())
            == plinth::service::ports::upgrades::UpgradeMethod::Lifecycle
    }

    /// The installer image's tag: the version it installs.
    fn image_version(image: &str) -> Result<String, Status> {
        let slash = image.rfind('/').map_or(0, |i| i + 1);
        let tag = image[slash..]
            .rsplit_once(':')
            .map(|(_, t)| t.to_string())
            .ok_or_else(|| Status::invalid_argument(format!("image {image} has no tag")))?;
        tag.parse::<plinth::talos::TalosVersion>().map_err(|e| {
            Status::invalid_argument(format!("error validating installer image {image:?}: {e}"))
        })?;
        Ok(tag)
    }

    /// Go down for a reboot, then come back on the staged version (or per the fault).
    fn reboot(self: &Arc<Self>) {
        let ms = self.opts.reboot_ms;
        {
            let mut c = self.cluster.lock().expect("cluster");
            self.down.store(true, std::sync::atomic::Ordering::SeqCst);
            c.nodes.remove(&self.ip);
            c.down.insert(self.ip);
            let cps_down = c
                .down
                .iter()
                .filter(|ip| c.members.iter().any(|m| m.ip == **ip))
                .count();
            c.max_cps_down = c.max_cps_down.max(cps_down);
            c.timeline.push(format!("down {}", self.cfg.hostname));
            // etcd elects another leader when the leader goes.
            let mine = *self.member_id.lock().expect("member");
            if mine.is_some() && Some(c.leader) == mine {
                let down = c.down.clone();
                c.leader = c
                    .members
                    .iter()
                    .find(|m| !down.contains(&m.ip))
                    .map_or(0, |m| m.id);
            }
        }
        let node = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let fault = node.upgrade_fault.lock().expect("fault").clone();
            if fault == Some(UpgradeFault::NeverBack)
                && node.staged.lock().expect("staged").is_some()
            {
                return;
            }
            let staged = node.staged.lock().expect("staged").take();
            if let Some(v) = staged {
                if fault != Some(UpgradeFault::Rollback) {
                    *node.version.lock().expect("version") = v;
                }
            }
            *node.boot_id.lock().expect("boot") = uuid::Uuid::new_v4().to_string();
            let mut c = node.cluster.lock().expect("cluster");
            c.down.remove(&node.ip);
            c.nodes.insert(
                node.ip,
                (node.cfg.is_control_plane(), node.cfg.hostname.clone()),
            );
            let mine = *node.member_id.lock().expect("member");
            if let (Some(id), 0) = (mine, c.leader) {
                c.leader = id;
            }
            c.timeline.push(format!(
                "up {} {}",
                node.cfg.hostname,
                node.running_version()
            ));
            node.installing
                .store(false, std::sync::atomic::Ordering::SeqCst);
            node.down.store(false, std::sync::atomic::Ordering::SeqCst);
        });
    }
}

#[derive(Clone)]
struct Api(Arc<Node>);

fn service(id: &str, state: &str, healthy: Option<bool>, msg: &str) -> machine::ServiceInfo {
    machine::ServiceInfo {
        id: id.into(),
        state: state.into(),
        events: Some(machine::ServiceEvents {
            events: vec![machine::ServiceEvent {
                msg: msg.into(),
                state: state.into(),
                ts: None,
            }],
        }),
        health: Some(machine::ServiceHealth {
            unknown: healthy.is_none(),
            healthy: healthy.unwrap_or(false),
            last_message: msg.into(),
            last_change: None,
        }),
    }
}

#[tonic::async_trait]
impl MachineService for Api {
    async fn bootstrap(
        &self,
        req: Request<machine::BootstrapRequest>,
    ) -> Result<Response<machine::BootstrapResponse>, Status> {
        let n = &self.0;
        n.enter(&req, "/machine.MachineService/Bootstrap").await?;
        let refuse = |s: Status| {
            n.record
                .lock()
                .expect("record")
                .bootstrap_refusals
                .push(s.message().to_string());
            Err(s)
        };
        if n.started.elapsed() < Duration::from_millis(n.opts.bootstrap_after_ms) {
            return refuse(Status::failed_precondition(
                "bootstrap is not available yet",
            ));
        }
        if !n.cfg.is_control_plane() {
            return refuse(Status::failed_precondition(
                "bootstrap can only be performed on a control plane node",
            ));
        }
        if *n.etcd_data.lock().expect("data") {
            return refuse(Status::already_exists("etcd data directory is not empty"));
        }
        let recover = req.get_ref().recover_etcd;
        let mut recovered = None;
        if recover {
            // As Talos' etcd service: restore from the uploaded snapshot, checking etcd's hash
            // unless told to skip it; the upload is used up.
            let Some((_, sha, trailer_ok)) = n.upload.lock().expect("upload").take() else {
                return refuse(Status::failed_precondition(
                    "no etcd snapshot was uploaded for the recovery (EtcdRecover first)",
                ));
            };
            if !trailer_ok && !req.get_ref().recover_skip_hash_check {
                return refuse(Status::internal(
                    "error recovering from the snapshot: snapshot file integrity check failed",
                ));
            }
            recovered = Some(sha);
        }
        {
            let mut c = n.cluster.lock().expect("cluster");
            c.next_id += 1;
            let id = 0x1000 + c.next_id;
            // A separate etcd if another node already has one: exactly what must never happen,
            // and what the tests look for.
            c.members.push(Member {
                id,
                hostname: n.cfg.hostname.clone(),
                ip: n.ip,
            });
            c.leader = id;
            *n.member_id.lock().expect("member") = Some(id);
            *n.etcd_data.lock().expect("data") = true;
        }
        {
            let mut r = n.record.lock().expect("record");
            r.bootstraps += 1;
            if let Some(sha) = recovered {
                let mut c = n.cluster.lock().expect("cluster");
                if let Some(rev) = c.served.get(&sha).copied() {
                    c.revision = rev;
                }
                r.recovered_from.push(sha);
            }
        }
        Ok(Response::new(machine::BootstrapResponse {
            messages: vec![machine::Bootstrap { metadata: None }],
        }))
    }

    async fn etcd_member_list(
        &self,
        req: Request<machine::EtcdMemberListRequest>,
    ) -> Result<Response<machine::EtcdMemberListResponse>, Status> {
        let n = &self.0;
        n.enter(&req, "/machine.MachineService/EtcdMemberList")
            .await?;
        if !n.cfg.is_control_plane() {
            return Err(Status::unimplemented(
                "etcd members list is only available on control plane nodes",
            ));
        }
        if !n.etcd_running() {
            return Err(Status::unavailable(
                "failed to create etcd client: etcd is not running on this node",
            ));
        }
        let c = n.cluster.lock().expect("cluster");
        let members = c
            .members
            .iter()
            .map(|m| machine::EtcdMember {
                id: m.id,
                hostname: m.hostname.clone(),
                peer_urls: vec![format!("https://{}:2380", m.ip)],
                client_urls: vec![format!("https://{}:2379", m.ip)],
                is_learner: false,
            })
            .collect();
        Ok(Response::new(machine::EtcdMemberListResponse {
            messages: vec![machine::EtcdMembers {
                metadata: None,
                legacy_members: vec![],
                members,
            }],
        }))
    }

    async fn etcd_recover(
        &self,
        req: Request<tonic::Streaming<common::Data>>,
    ) -> Result<Response<machine::EtcdRecoverResponse>, Status> {
        let n = &self.0;
        n.enter(&req, "/machine.MachineService/EtcdRecover").await?;
        if !n.cfg.is_control_plane() {
            return Err(Status::unimplemented(
                "etcd recover is only available on control plane nodes",
            ));
        }
        // Kept as it arrives (here: hashed), never whole; etcd's trailer checked at the end.
        held(&n.cluster).await;
        let mut stream = req.into_inner();
        let (mut size, mut all, mut body) = (0u64, sha2::Sha256::new(), sha2::Sha256::new());
        let mut tail: Vec<u8> = Vec::new();
        loop {
            match stream.message().await {
                Ok(Some(d)) => {
                    size += d.bytes.len() as u64;
                    all.update(&d.bytes);
                    tail.extend_from_slice(&d.bytes);
                    if tail.len() > 32 {
                        let cut = tail.len() - 32;
                        body.update(&tail[..cut]);
                        tail.drain(..cut);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // The client went away mid-upload: nothing is kept (as Talos removes it).
                    n.record.lock().expect("record").recover_aborted += 1;
                    return Err(e);
                }
            }
        }
        let sha = hex::encode(all.finalize());
        let trailer_ok = size % 512 == 32 && body.finalize().as_slice() == tail.as_slice();
        *n.upload.lock().expect("upload") = Some((size, sha.clone(), trailer_ok));
        n.record
            .lock()
            .expect("record")
            .recover_uploads
            .push((size, sha, trailer_ok));
        Ok(Response::new(machine::EtcdRecoverResponse {
            messages: vec![machine::EtcdRecover { metadata: None }],
        }))
    }

    type EtcdSnapshotStream =
        Pin<Box<dyn futures::Stream<Item = Result<common::Data, Status>> + Send + 'static>>;

    async fn etcd_snapshot(
        &self,
        req: Request<machine::EtcdSnapshotRequest>,
    ) -> Result<Response<Self::EtcdSnapshotStream>, Status> {
        let n = self.0.clone();
        n.enter(&req, "/machine.MachineService/EtcdSnapshot")
            .await?;
        if !n.cfg.is_control_plane() {
            return Err(Status::unimplemented(
                "etcd snapshot is only available on control plane nodes",
            ));
        }
        if !n.etcd_running() {
            return Err(Status::unavailable(
                "failed to create etcd client: etcd is not running on this node",
            ));
        }
        let (revision, corrupt, hold_after) = {
            let c = n.cluster.lock().expect("cluster");
            (c.revision(), c.snapshot_corrupt, c.hold_after)
        };
        let db = super::etcd_db::EtcdDb::new(n.opts.snapshot_bytes.unwrap_or(1 << 20), revision);
        // Generated as it is sent (a bounded channel: the client's pace), never held whole.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<common::Data, Status>>(4);
        tokio::spawn(async move {
            let mut all = sha2::Sha256::new();
            let mut size = 0u64;
            let chunks = db.chunks(256 << 10);
            let mut first = true;
            let mut begun = false;
            for mut bytes in chunks {
                if corrupt && first && bytes.len() > 100 {
                    bytes[100] ^= 0x5a;
                }
                first = false;
                size += bytes.len() as u64;
                all.update(&bytes);
                if tx
                    .send(Ok(common::Data {
                        metadata: None,
                        bytes,
                    }))
                    .await
                    .is_err()
                {
                    return;
                }
                if !begun && size >= hold_after {
                    begun = true;
                    n.cluster.lock().expect("cluster").snapshots_begun += 1;
                    held(&n.cluster).await;
                }
            }
            let sha = hex::encode(all.finalize());
            n.cluster
                .lock()
                .expect("cluster")
                .served
                .insert(sha.clone(), db.revision);
            n.record.lock().expect("record").snapshots.push((size, sha));
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn etcd_status(
        &self,
        req: Request<()>,
    ) -> Result<Response<machine::EtcdStatusResponse>, Status> {
        let n = &self.0;
        n.enter(&req, "/machine.MachineService/EtcdStatus").await?;
        if !n.cfg.is_control_plane() {
            return Err(Status::unimplemented(
                "etcd status is only available on control plane nodes",
            ));
        }
        let Some(id) = *n.member_id.lock().expect("member") else {
            return Err(Status::unavailable(
                "failed to create etcd client: etcd is not running on this node",
            ));
        };
        let c = n.cluster.lock().expect("cluster");
        Ok(Response::new(machine::EtcdStatusResponse {
            messages: vec![machine::EtcdStatus {
                metadata: None,
                member_status: Some(machine::EtcdMemberStatus {
                    storage_version: "3.5.0".into(),
                    member_id: id,
                    protocol_version: "3.5.16".into(),
                    db_size: 4 << 20,
                    db_size_in_use: 2 << 20,
                    leader: c.leader,
                    raft_index: 100 + c.members.len() as u64,
                    raft_term: 2,
                    raft_applied_index: 100 + c.members.len() as u64,
                    errors: vec![],
                    is_learner: false,
                }),
            }],
        }))
    }

    async fn service_list(
        &self,
        req: Request<()>,
    ) -> Result<Response<machine::ServiceListResponse>, Status> {
        let n = &self.0;
        n.enter(&req, "/machine.MachineService/ServiceList").await?;
        let mut services = vec![
            service("apid", "Running", Some(true), ""),
            service("containerd", "Running", Some(true), ""),
            service("machined", "Running", Some(true), ""),
        ];
        let running = n.etcd_running();
        let bootstrapped = !n.cluster.lock().expect("cluster").members.is_empty();
        if n.cfg.is_control_plane() {
            services.push(if running {
                service("etcd", "Running", Some(true), "")
            } else {
                service("etcd", "Preparing", None, "Running pre state")
            });
            services.push(service("trustd", "Running", Some(true), ""));
        }
        let kubelet_broken = *n.upgrade_fault.lock().expect("fault")
            == Some(UpgradeFault::KubeletUnhealthy)
            && n.running_version() != n.cfg.version;
        services.push(if kubelet_broken {
            service(
                "kubelet",
                "Running",
                Some(false),
                "node not ready: PLEG is not healthy",
            )
        } else if bootstrapped {
            service("kubelet", "Running", Some(true), "")
        } else {
            service("kubelet", "Running", Some(false), "kubelet is not ready")
        });
        services.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Response::new(machine::ServiceListResponse {
            messages: vec![machine::ServiceList {
                metadata: None,
                services,
            }],
        }))
    }

    async fn upgrade(
        &self,
        req: Request<machine::UpgradeRequest>,
    ) -> Result<Response<machine::UpgradeResponse>, Status> {
        let n = self.0.clone();
        n.enter(&req, "/machine.MachineService/Upgrade").await?;
        let r = req.into_inner();
        // Talos pulls and validates the installer before anything else.
        let target = Node::image_version(&r.image)?;
        if n.cfg.is_control_plane() && !r.force && !r.preserve {
            // etcd's ValidateForUpgrade, as machined runs it on a control plane.
            let c = n.cluster.lock().expect("cluster");
            if c.members.len() == 2 {
                return Err(Status::unknown(format!(
                    "error validating etcd for upgrade: etcd member count({}) is insufficient to maintain quorum if upgrade commences",
                    c.members.len()
                )));
            }
            if let Some(m) = c.members.iter().find(|m| c.down.contains(&m.ip)) {
                return Err(Status::unknown(format!(
                    "error validating etcd for upgrade: etcd member {:016x} is not healthy; all members must be healthy to perform an upgrade",
                    m.id
                )));
            }
        }
        if n.installing.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(Status::failed_precondition(
                "an upgrade is already in progress",
            ));
        }
        n.record
            .lock()
            .expect("record")
            .upgrades
            .push(("MachineService.Upgrade".into(), r.image.clone()));
        // The upgrade sequence runs after the answer: cordon, drain, install into the other
        // slot, reboot.
        let fault = n.upgrade_fault.lock().expect("fault").clone();
        if !matches!(fault, Some(UpgradeFault::InstallerExit(_))) {
            *n.staged.lock().expect("staged") = Some(target);
        }
        let node = n.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            node.reboot();
        });
        Ok(Response::new(machine::UpgradeResponse {
            messages: vec![machine::Upgrade {
                metadata: None,
                ack: "Upgrade request received".into(),
                actor_id: uuid::Uuid::new_v4().to_string(),
            }],
        }))
    }

    type ReadStream =
        Pin<Box<dyn futures::Stream<Item = Result<common::Data, Status>> + Send + 'static>>;

    async fn read(
        &self,
        req: Request<machine::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        let n = &self.0;
        n.enter(&req, "/machine.MachineService/Read").await?;
        let path = req.into_inner().path;
        if path != "/proc/sys/kernel/random/boot_id" {
            return Err(Status::not_found(format!(
                "open {path}: no such file or directory"
            )));
        }
        let id = format!("{}\n", n.boot_id.lock().expect("boot"));
        let chunk = common::Data {
            metadata: None,
            bytes: id.into_bytes(),
        };
        Ok(Response::new(Box::pin(futures::stream::iter(vec![Ok(
            chunk,
        )]))))
    }

    async fn reboot(
        &self,
        req: Request<machine::RebootRequest>,
    ) -> Result<Response<machine::RebootResponse>, Status> {
        let n = self.0.clone();
        n.enter(&req, "/machine.MachineService/Reboot").await?;
        n.record
            .lock()
            .expect("record")
            .upgrades
            .push(("MachineService.Reboot".into(), String::new()));
        let node = n.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            node.reboot();
        });
        Ok(Response::new(machine::RebootResponse {
            messages: vec![machine::Reboot {
                metadata: None,
                actor_id: uuid::Uuid::new_v4().to_string(),
            }],
        }))
    }

    async fn version(
        &self,
        req: Request<()>,
    ) -> Result<Response<machine::VersionResponse>, Status> {
        let n = &self.0;
        n.enter(&req, "/machine.MachineService/Version").await?;
        let tag = n.running_version();
        Ok(Response::new(machine::VersionResponse {
            messages: vec![machine::Version {
                metadata: None,
                version: Some(machine::VersionInfo {
                    tag,
                    sha: "0123456789ab".into(),
                    built: String::new(),
                    go_version: "go1.24".into(),
                    os: "linux".into(),
                    arch: "amd64".into(),
                }),
                platform: Some(machine::PlatformInfo {
                    name: "metal".into(),
                    mode: "metal".into(),
                }),
                features: Some(machine::FeaturesInfo { rbac: true }),
            }],
        }))
    }
}

type Progress = Result<cluster::HealthCheckProgress, Status>;

#[tonic::async_trait]
impl ClusterService for Api {
    type HealthCheckStream = Pin<Box<dyn futures::Stream<Item = Progress> + Send + 'static>>;

    async fn health_check(
        &self,
        req: Request<cluster::HealthCheckRequest>,
    ) -> Result<Response<Self::HealthCheckStream>, Status> {
        let n = self.0.clone();
        n.enter(&req, "/cluster.ClusterService/HealthCheck").await?;
        if !n.cfg.is_control_plane() {
            return Err(Status::unimplemented(
                "cluster health check is only available on control plane nodes",
            ));
        }
        let r = req.into_inner();
        let wait = r
            .wait_timeout
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or(Duration::from_secs(600));
        let info = r.cluster_info.unwrap_or_default();
        let (tx, rx) = tokio::sync::mpsc::channel::<Progress>(64);
        tokio::spawn(async move {
            let deadline = Instant::now() + wait;
            let send = |m: String| {
                let tx = tx.clone();
                async move {
                    tx.send(Ok(cluster::HealthCheckProgress {
                        metadata: None,
                        message: m,
                    }))
                    .await
                    .is_ok()
                }
            };
            let all: Vec<String> = info
                .control_plane_nodes
                .iter()
                .chain(&info.worker_nodes)
                .cloned()
                .collect();
            if !send(format!("discovered nodes: {all:?}")).await {
                return;
            }
            let cps: Vec<IpAddr> = info
                .control_plane_nodes
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect();
            let nodes: Vec<IpAddr> = all.iter().filter_map(|s| s.parse().ok()).collect();
            type Check = Box<dyn Fn(&ClusterState) -> Result<(), String> + Send>;
            let cps2 = cps.clone();
            let checks: Vec<(&str, Check)> = vec![
                (
                    "etcd to be healthy",
                    Box::new(move |c: &ClusterState| {
                        let missing: Vec<String> = cps2
                            .iter()
                            .filter(|ip| {
                                !c.members.iter().any(|m| m.ip == **ip) || c.down.contains(ip)
                            })
                            .map(|ip| ip.to_string())
                            .collect();
                        if c.members.is_empty() || c.leader == 0 {
                            Err("etcd is not running".into())
                        } else if !missing.is_empty() {
                            Err(format!("etcd is not healthy on {missing:?}"))
                        } else {
                            Ok(())
                        }
                    }),
                ),
                (
                    "etcd members to be control plane nodes",
                    Box::new(move |c: &ClusterState| {
                        let extra: Vec<String> = c
                            .members
                            .iter()
                            .filter(|m| !cps.contains(&m.ip))
                            .map(|m| m.ip.to_string())
                            .collect();
                        if extra.is_empty() {
                            Ok(())
                        } else {
                            Err(format!(
                                "etcd members {extra:?} are not control plane nodes"
                            ))
                        }
                    }),
                ),
                (
                    "apid to be ready",
                    Box::new(move |c: &ClusterState| {
                        let down: Vec<String> = nodes
                            .iter()
                            .filter(|ip| !c.nodes.contains_key(ip))
                            .map(|ip| ip.to_string())
                            .collect();
                        if down.is_empty() {
                            Ok(())
                        } else {
                            Err(format!("apid is not reachable on {down:?}"))
                        }
                    }),
                ),
                (
                    "kubelet to be healthy",
                    Box::new(|c: &ClusterState| {
                        if c.members.is_empty() {
                            Err("kubelet is not ready".into())
                        } else {
                            Ok(())
                        }
                    }),
                ),
            ];
            for (name, check) in checks {
                let mut last = String::new();
                loop {
                    let verdict = {
                        n.sync_etcd();
                        let c = n.cluster.lock().expect("cluster");
                        check(&c)
                    };
                    let line = match &verdict {
                        Ok(()) => format!("waiting for {name}: OK"),
                        Err(_) if last.is_empty() => format!("waiting for {name}: ..."),
                        Err(e) => format!("waiting for {name}: {e}"),
                    };
                    if line != last {
                        if !send(line.clone()).await {
                            return;
                        }
                        last = line;
                    }
                    match verdict {
                        Ok(()) => break,
                        Err(e) if Instant::now() >= deadline => {
                            let line = format!("waiting for {name}: {e}");
                            if line != last {
                                send(line).await;
                            }
                            let _ = tx
                                .send(Err(Status::deadline_exceeded("context deadline exceeded")))
                                .await;
                            return;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// A TLS connection with the roles of its client, for tonic.
struct Conn {
    inner: tokio_rustls::server::TlsStream<TcpStream>,
    peer: Peer,
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = Peer;
    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The roles of a client certificate (its Organizations), or why apid would refuse it: its
/// extended key usage must be client auth and nothing else.
fn client_roles(der: &[u8]) -> Result<Vec<String>, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
    let eku = cert
        .extended_key_usage()
        .map_err(|e| e.to_string())?
        .map(|e| e.value.clone());
    match eku {
        Some(e) if e.client_auth && !e.server_auth && !e.any && e.other.is_empty() => {}
        _ => return Err("the certificate is missing the client auth extended key usage".into()),
    }
    Ok(cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect())
}

/// The server certificate: from the cluster's OS CA (or a foreign one), for `ips`.
fn server_identity(
    cfg: &NodeConfig,
    foreign: bool,
    ips: &[IpAddr],
) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let (issuer, issuer_key) = if foreign {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "talos");
        p.distinguished_name = dn;
        p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        (p.self_signed(&key).expect("foreign CA"), key)
    } else {
        let (_, der) = x509_parser::pem::parse_x509_pem(cfg.ca_key.as_bytes()).expect("CA key PEM");
        let key = KeyPair::try_from(der.contents.as_slice()).expect("CA key");
        let p = CertificateParams::from_ca_cert_pem(&cfg.ca_crt).expect("CA certificate");
        (p.self_signed(&key).expect("issuer"), key)
    };
    let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("server key");
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cfg.hostname.as_str());
    p.distinguished_name = dn;
    p.subject_alt_names = ips.iter().map(|ip| SanType::IpAddress(*ip)).collect();
    if !cfg.hostname.is_empty() {
        if let Ok(name) = cfg.hostname.clone().try_into() {
            p.subject_alt_names.push(SanType::DnsName(name));
        }
    }
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::minutes(5);
    p.not_after = now + time::Duration::days(365);
    let cert = p
        .signed_by(&key, &issuer, &issuer_key)
        .expect("server cert");
    (
        vec![cert.der().clone()],
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key"),
    )
}

/// A running node: its address, its record, faults on demand; stopped on drop.
pub struct TalosNode {
    pub addr: SocketAddr,
    /// SHA-256 (hex) of the server certificate's DER.
    pub cert_sha256: String,
    node: Arc<Node>,
    stop: CancellationToken,
}

impl Drop for TalosNode {
    fn drop(&mut self) {
        self.stop.cancel();
        self.node
            .cluster
            .lock()
            .map(|mut c| c.nodes.remove(&self.node.ip))
            .ok();
    }
}

impl TalosNode {
    /// Serve on `listen` (port 0 for any) as the node configured by `machine_config`, in the
    /// etcd cluster `cluster`; the server certificate names `listen`'s address (and, on an
    /// unspecified address, every address of the host).
    pub async fn start(
        listen: SocketAddr,
        machine_config: &str,
        opts: NodeOptions,
        cluster: SharedCluster,
    ) -> TalosNode {
        let listener = TcpListener::bind(listen).await.expect("bind Talos API");
        Self::serve(listener, machine_config, opts, cluster).await
    }

    /// Serve on a bound listener (a port the test chose before Plinth started).
    pub async fn serve(
        listener: TcpListener,
        machine_config: &str,
        opts: NodeOptions,
        cluster: SharedCluster,
    ) -> TalosNode {
        let mut cfg = NodeConfig::from_machine_config(machine_config);
        {
            // A control plane has the OS CA key (and runs trustd); a worker's config has none
            // and gets its certificate signed by a control plane's trustd.
            let mut c = cluster.lock().expect("cluster");
            if cfg.ca_key.trim().is_empty() {
                cfg.ca_key = c.trustd_key.clone().or(opts.trustd_key.clone()).expect(
                    "a worker gets its certificate from a control plane's trustd: start a control plane of this cluster first",
                );
            } else if cfg.is_control_plane() {
                c.trustd_key.get_or_insert(cfg.ca_key.clone());
            }
        }
        if cfg.hostname.is_empty() {
            cfg.hostname = opts.hostname.clone().unwrap_or_else(|| "talos-node".into());
        }
        let addr = listener.local_addr().expect("addr");
        let ips: Vec<IpAddr> = if addr.ip().is_unspecified() {
            if_addrs::get_if_addrs()
                .expect("addresses")
                .into_iter()
                .map(|i| i.ip())
                .collect()
        } else {
            vec![addr.ip()]
        };
        let (chain, key) = server_identity(&cfg, opts.foreign, &ips);
        let cert_sha256 = hex::encode(sha2::Sha256::digest(chain[0].as_ref()));
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(cfg.ca_crt.as_bytes()) {
            roots.add(c.expect("CA")).expect("root");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .expect("client verifier");
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("server config");
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        // The node's own address (what etcd and the health check know it by): not loopback.
        let ip = ips
            .iter()
            .copied()
            .find(|i| !i.is_loopback())
            .or(ips.first().copied())
            .unwrap_or(addr.ip());
        let (opts_version, opts_fault) = (opts.version.clone(), opts.upgrade_fault.clone());
        let node = Arc::new(Node {
            cfg: cfg.clone(),
            opts,
            ip,
            member_id: Mutex::new(None),
            etcd_data: Mutex::new(false),
            upload: Mutex::new(None),
            cluster: cluster.clone(),
            faults: Mutex::default(),
            record: Mutex::default(),
            started: Instant::now(),
            version: Mutex::new(opts_version.unwrap_or_else(|| cfg.version.clone())),
            boot_id: Mutex::new(uuid::Uuid::new_v4().to_string()),
            down: std::sync::atomic::AtomicBool::new(false),
            pulled: Mutex::default(),
            staged: Mutex::new(None),
            installing: std::sync::atomic::AtomicBool::new(false),
            upgrade_fault: Mutex::new(opts_fault),
        });
        cluster
            .lock()
            .expect("cluster")
            .nodes
            .insert(ip, (cfg.is_control_plane(), cfg.hostname.clone()));
        let stop = CancellationToken::new();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Conn, std::io::Error>>(16);
        let accept_node = node.clone();
        let accept_stop = stop.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    _ = accept_stop.cancelled() => return,
                    r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                };
                if accept_node.is_down() {
                    // Rebooting: nothing listens.
                    drop(tcp);
                    continue;
                }
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                let node = accept_node.clone();
                tokio::spawn(async move {
                    let hs =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await;
                    let Ok(Ok(tls)) = hs else {
                        node.record.lock().expect("record").rejected_handshakes += 1;
                        return;
                    };
                    let der = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| c.as_ref().to_vec())
                        .unwrap_or_default();
                    let roles = match client_roles(&der) {
                        Ok(r) => r,
                        Err(_) => {
                            node.record.lock().expect("record").rejected_handshakes += 1;
                            return;
                        }
                    };
                    let _ = tx
                        .send(Ok(Conn {
                            inner: tls,
                            peer: Peer { roles },
                        }))
                        .await;
                });
            }
        });
        let api = Api(node.clone());
        let serve_stop = stop.clone();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(MachineServiceServer::new(api.clone()))
                .add_service(ImageServiceServer::new(api.clone()))
                .add_service(LifecycleServiceServer::new(api.clone()))
                .add_service(ClusterServiceServer::new(api))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                    serve_stop.cancelled_owned(),
                )
                .await;
        });
        TalosNode {
            addr,
            cert_sha256,
            node,
            stop,
        }
    }

    /// The next `times` calls of `method` (`Version`, `Bootstrap`, ...) answer `code`.
    pub fn fail(&self, method: &str, times: u32, code: Code, message: &str) {
        self.node.faults.lock().expect("faults").insert(
            method.into(),
            Fault {
                status: Some((code, message.into())),
                delay: None,
                times,
            },
        );
    }

    /// The next `times` calls of `method` answer only after `delay`.
    pub fn delay(&self, method: &str, times: u32, delay: Duration) {
        self.node.faults.lock().expect("faults").insert(
            method.into(),
            Fault {
                status: None,
                delay: Some(delay),
                times,
            },
        );
    }

    /// Snapshots streamed whole: (bytes, SHA-256 hex).
    pub fn snapshots(&self) -> Vec<(u64, String)> {
        self.node.record.lock().expect("record").snapshots.clone()
    }

    /// Recovery uploads received whole: (bytes, SHA-256 hex, etcd's trailer matched).
    pub fn recover_uploads(&self) -> Vec<(u64, String, bool)> {
        self.node
            .record
            .lock()
            .expect("record")
            .recover_uploads
            .clone()
    }

    /// Recovery uploads cut off before their end.
    pub fn recover_aborted(&self) -> u32 {
        self.node.record.lock().expect("record").recover_aborted
    }

    /// Bootstraps that restored etcd from an uploaded snapshot (its SHA-256).
    pub fn recovered_from(&self) -> Vec<String> {
        self.node
            .record
            .lock()
            .expect("record")
            .recovered_from
            .clone()
    }

    /// The node lost its etcd and was wiped (EPHEMERAL reset): no data, not a member; its etcd
    /// waits for a bootstrap (or joins a cluster that has one).
    pub fn lose_etcd(&self) {
        let mut c = self.node.cluster.lock().expect("cluster");
        let mut mine = self.node.member_id.lock().expect("member");
        if let Some(id) = mine.take() {
            c.members.retain(|m| m.id != id);
            if c.leader == id {
                c.leader = c.members.first().map_or(0, |m| m.id);
            }
        }
        *self.node.etcd_data.lock().expect("data") = false;
    }

    /// Bootstraps that started etcd here.
    pub fn bootstraps(&self) -> u32 {
        self.node.record.lock().expect("record").bootstraps
    }

    /// Refused bootstrap calls (their messages).
    pub fn bootstrap_refusals(&self) -> Vec<String> {
        self.node
            .record
            .lock()
            .expect("record")
            .bootstrap_refusals
            .clone()
    }

    /// Every call with the caller's roles.
    pub fn calls(&self) -> Vec<(String, Vec<String>)> {
        self.node.record.lock().expect("record").calls.clone()
    }

    /// TLS handshakes refused.
    pub fn rejected_handshakes(&self) -> u32 {
        self.node.record.lock().expect("record").rejected_handshakes
    }

    /// Upgrade calls taken: (call, image).
    pub fn upgrades(&self) -> Vec<(String, String)> {
        self.node.record.lock().expect("record").upgrades.clone()
    }

    /// The version it runs now.
    pub fn version(&self) -> String {
        self.node.running_version()
    }

    /// From now on, upgrades of this node go wrong this way (`None`: they go well).
    pub fn set_upgrade_fault(&self, fault: Option<UpgradeFault>) {
        *self.node.upgrade_fault.lock().expect("fault") = fault;
    }
}

#[tonic::async_trait]
impl ImageService for Api {
    type PullStream = Pin<
        Box<dyn futures::Stream<Item = Result<machine::ImageServicePullResponse, Status>> + Send>,
    >;

    async fn pull(
        &self,
        req: Request<machine::ImageServicePullRequest>,
    ) -> Result<Response<Self::PullStream>, Status> {
        let n = &self.0;
        n.enter(&req, "/machine.ImageService/Pull").await?;
        if !n.has_lifecycle() {
            return Err(Status::unimplemented(
                "unknown service machine.ImageService",
            ));
        }
        let r = req.into_inner();
        Node::image_version(&r.image_ref)?;
        n.pulled.lock().expect("pulled").insert(r.image_ref.clone());
        use machine::image_service_pull_response::Response as Pull;
        let progress = machine::ImageServicePullResponse {
            response: Some(Pull::PullProgress(machine::ImageServicePullProgress {
                layer_id: "sha256:0123".into(),
                progress: Some(machine::ImageServicePullLayerProgress {
                    status: 3,
                    offset: 1 << 20,
                    total: 1 << 20,
                }),
            })),
        };
        let done = machine::ImageServicePullResponse {
            response: Some(Pull::Name(r.image_ref)),
        };
        Ok(Response::new(Box::pin(futures::stream::iter(vec![
            Ok(progress),
            Ok(done),
        ]))))
    }
}

#[tonic::async_trait]
impl LifecycleService for Api {
    type UpgradeStream = Pin<
        Box<
            dyn futures::Stream<Item = Result<machine::LifecycleServiceUpgradeResponse, Status>>
                + Send,
        >,
    >;

    async fn upgrade(
        &self,
        req: Request<machine::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        let n = self.0.clone();
        n.enter(&req, "/machine.LifecycleService/Upgrade").await?;
        if !n.has_lifecycle() {
            return Err(Status::unimplemented(
                "unknown service machine.LifecycleService",
            ));
        }
        let image = req
            .into_inner()
            .source
            .map(|s| s.image_name)
            .unwrap_or_default();
        if image.is_empty() {
            return Err(Status::invalid_argument("installer image name is required"));
        }
        let target = Node::image_version(&image)?;
        if !n.pulled.lock().expect("pulled").contains(&image) {
            return Err(Status::internal(format!(
                "upgrade failed: failed to get image {image:?}: image not found"
            )));
        }
        if n.installing.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(Status::failed_precondition(
                "another installation/upgrade is already in progress",
            ));
        }
        n.record
            .lock()
            .expect("record")
            .upgrades
            .push(("LifecycleService.Upgrade".into(), image.clone()));
        let exit = match *n.upgrade_fault.lock().expect("fault") {
            Some(UpgradeFault::InstallerExit(code)) => code,
            _ => 0,
        };
        if exit == 0 {
            *n.staged.lock().expect("staged") = Some(target);
        }
        n.installing
            .store(false, std::sync::atomic::Ordering::SeqCst);
        use machine::lifecycle_service_install_progress::Response as P;
        let msg = |r: P| {
            Ok(machine::LifecycleServiceUpgradeResponse {
                progress: Some(machine::LifecycleServiceInstallProgress { response: Some(r) }),
            })
        };
        Ok(Response::new(Box::pin(futures::stream::iter(vec![
            msg(P::Message(format!("installing {image}"))),
            msg(P::Message(if exit == 0 {
                "upgrade of the boot slot done".into()
            } else {
                "error writing the boot partition".into()
            })),
            msg(P::ExitCode(exit)),
        ]))))
    }
}

/// The spec of a node run as a process of its own.
#[derive(Debug, Deserialize)]
pub struct ProcessSpec {
    /// The machine config file.
    pub config: String,
    /// Where to listen, `0.0.0.0:50000`.
    pub listen: String,
    #[serde(default)]
    pub options: NodeOptions,
    /// Append a JSON line per bootstrap and refusal here, if set.
    #[serde(default)]
    pub record: Option<String>,
}

/// Run a node until killed (the entry of the re-executed test binary).
pub fn run_process(spec_path: &str) {
    let spec: ProcessSpec =
        serde_json::from_str(&std::fs::read_to_string(spec_path).expect("node spec"))
            .expect("node spec JSON");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let yaml = std::fs::read_to_string(&spec.config).expect("machine config");
        let node = TalosNode::start(
            spec.listen.parse().expect("listen"),
            &yaml,
            spec.options,
            SharedCluster::default(),
        )
        .await;
        println!("talos api test node listening on {}", node.addr);
        let mut seen = (0, 0);
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = (node.bootstraps(), node.bootstrap_refusals().len());
            if now != seen {
                seen = now;
                println!(
                    "talos api test node: bootstraps={} refusals={:?}",
                    now.0,
                    node.bootstrap_refusals()
                );
                if let Some(r) = &spec.record {
                    let _ = std::fs::write(
                        r,
                        serde_json::json!({"bootstraps": now.0, "refusals": node.bootstrap_refusals()})
                            .to_string(),
                    );
                }
            }
        }
    });
}

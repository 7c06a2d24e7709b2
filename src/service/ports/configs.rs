//! The `ConfigStore` port and the records it keeps: the declared clusters (spec and sealed
//! secrets), profiles, site and rack groups, each machine's own patches, the config last served to
//! a machine (sealed), and provisioning windows with the hash of their install token. The records
//! are plain data; what they mean (rendering, sealing, serving) is `service::machine_config`'s.
//! Imports `domain`, `talos::disk` (a profile's install-disk rules) and the other ports only.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::events::NewEvent;
use super::reinstalls::ReinstallPolicy;
use crate::domain::MachineId;
use crate::talos::disk::DiskRules;

/// A patch as declared: where it came from (for messages) and its text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchSource {
    /// File name, or `<file>#patches[2]` for an inline patch.
    pub origin: String,
    /// Strategic merge patch (YAML) or RFC 6902 JSON patch.
    pub text: String,
}

/// Patches per role.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolePatches {
    /// For control-plane machines.
    #[serde(default)]
    pub controlplane: Vec<PatchSource>,
    /// For workers.
    #[serde(default)]
    pub worker: Vec<PatchSource>,
}

/// A Talos cluster as declared (nothing secret in it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Cluster name.
    pub name: String,
    /// Control-plane endpoint, `https://VIP:6443`.
    pub endpoint: String,
    /// Target Talos version, `v1.11.6`.
    pub talos_version: String,
    /// Kubernetes version (default: the Talos release's own default).
    #[serde(default)]
    pub kubernetes_version: Option<String>,
    /// Image Factory schematic id of the installer, kernel and initramfs.
    pub schematic_id: String,
    /// The schematic's part of Image Factory's PXE kernel line: its META values as one
    /// `talos.environment=INSTALLER_META_BASE64=...` argument, then its
    /// `customization.extraKernelArgs` (known when the inventory gives the `schematic`, not
    /// just its id).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schematic_kernel_args: Vec<String>,
    /// Image Factory host for the installer image.
    pub factory_host: String,
    /// A full installer image reference instead of the factory's.
    #[serde(default)]
    pub install_image: Option<String>,
    /// Patches for every machine of the cluster.
    #[serde(default)]
    pub patches: Vec<PatchSource>,
    /// Patches per role.
    #[serde(default)]
    pub role_patches: RolePatches,
    /// Extra kernel arguments for installs.
    #[serde(default)]
    pub kernel_args: Vec<String>,
    /// Reinstall policy (automatic reinstall, workers per rack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reinstall: Option<ReinstallPolicy>,
    /// How etcd is bootstrapped: `auto` (default) or `manual`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapMode>,
    /// How configs are released: `token` (default: to the machine's own boot token) or
    /// `approve` (an operator approves each release, matching the code its console shows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// Rolling upgrade policy (workers per rack, node deadline, snapshot age).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<super::upgrades::UpgradePolicy>,
    /// etcd snapshots: how often, how many kept, where (`etcdSnapshots`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_snapshots: Option<crate::domain::snapshots::SnapshotPolicy>,
}

/// How a cluster's configs are released (`delivery:` of a Cluster in the inventory directory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// To the machine's own install boot, bound to its address and token (the default).
    #[default]
    Token,
    /// As `token`, and only after an operator approves this boot's release with the short code
    /// the machine's console shows.
    Approve,
}

/// The approval state of a machine's current install boot (`delivery: approve`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Approval {
    /// SHA-256 (hex) of the code this boot's script showed; never shown.
    pub code_sha256: Option<String>,
    /// When an operator approved this boot's release.
    pub approved_at: Option<DateTime<Utc>>,
    /// Who approved it.
    pub approved_by: Option<String>,
}

/// How a cluster is bootstrapped (`bootstrap:` of a Cluster in the inventory directory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BootstrapMode {
    /// Plinth bootstraps the first verified control plane (the default).
    #[default]
    Auto,
    /// Plinth waits for `plinth cluster bootstrap`.
    Manual,
}

/// A hardware/provisioning profile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileSpec {
    /// Profile name (machines name it in `profile`).
    pub name: String,
    /// Hardware patches.
    #[serde(default)]
    pub patches: Vec<PatchSource>,
    /// Extra kernel arguments.
    #[serde(default)]
    pub kernel_args: Vec<String>,
    /// Install-disk rules.
    #[serde(default)]
    pub install_disk: Option<DiskRules>,
    /// Wipe the install disk when installing.
    #[serde(default)]
    pub wipe: bool,
    /// One-time boot target a reinstall sets through the BMC: `pxe`, `http` (UEFI HTTP boot) or
    /// `cd` (virtual media, with `bootMediaUrl`); default `[workflows] boot_target`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_target: Option<String>,
    /// ISO a reinstall inserts as virtual media when `bootTarget` is `cd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_media_url: Option<String>,
}

/// What a group is keyed on: the machine's site or rack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupKind {
    /// A site.
    Site,
    /// A rack.
    Rack,
}

impl GroupKind {
    /// `site` or `rack`.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupKind::Site => "site",
            GroupKind::Rack => "rack",
        }
    }
}

impl std::str::FromStr for GroupKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "site" => Ok(GroupKind::Site),
            "rack" => Ok(GroupKind::Rack),
            other => Err(format!("`{other}` is not a group kind: site or rack")),
        }
    }
}

/// Patches for every machine of a site or rack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupSpec {
    /// Site or rack.
    pub kind: GroupKind,
    /// Its name, as machines carry it in `site` / `rack`.
    pub name: String,
    /// Patches.
    #[serde(default)]
    pub patches: Vec<PatchSource>,
    /// Extra kernel arguments.
    #[serde(default)]
    pub kernel_args: Vec<String>,
}

/// A machine's own config inputs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachinePatches {
    /// Patches applied last.
    #[serde(default)]
    pub patches: Vec<PatchSource>,
    /// Extra kernel arguments.
    #[serde(default)]
    pub kernel_args: Vec<String>,
}

/// A cluster as stored: spec plus sealed secrets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRecord {
    /// The declared spec.
    pub spec: ClusterSpec,
    /// Sealed secrets bundle.
    pub sealed_bundle: Option<Vec<u8>>,
    /// Sealed base configs (control plane, worker).
    pub sealed_base: Option<(Vec<u8>, Vec<u8>)>,
    /// Fingerprint of the secret input.
    pub secrets_sha256: String,
}

/// The config last served to a machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedConfig {
    /// Sealed YAML.
    pub sealed: Vec<u8>,
    /// SHA-256 of the YAML.
    pub sha256: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// A machine's provisioning window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ProvisionWindow {
    /// The machine.
    pub machine_id: MachineId,
    /// Opened at.
    pub opened_at: DateTime<Utc>,
    /// Expires at.
    pub expires_at: DateTime<Utc>,
    /// Who opened it.
    pub opened_by: String,
    /// Wipe the system disk on the install boot.
    pub wipe: bool,
    /// SHA-256 (hex) of the token of the latest install boot; never shown.
    #[serde(skip)]
    pub token_sha256: Option<String>,
    /// When that token was minted.
    pub token_minted_at: Option<DateTime<Utc>>,
    /// The address the token was minted for (the machine's own, that asked for the install
    /// script): only a fetch from it is served.
    pub token_ip: Option<String>,
    /// When the token was used (a config was served for it): it serves once.
    pub token_used_at: Option<DateTime<Utc>>,
    /// Closed at.
    pub closed_at: Option<DateTime<Utc>>,
    /// Why it closed.
    pub close_reason: Option<String>,
}

impl ProvisionWindow {
    /// Open at `now`: not closed and not expired.
    pub fn is_open(&self, now: DateTime<Utc>) -> bool {
        self.closed_at.is_none() && self.expires_at > now
    }
}

/// Everything `plinth apply` writes besides machines, in one transaction.
#[derive(Clone, Debug, Default)]
pub struct ConfigWrite {
    /// Clusters (upserted).
    pub clusters: Vec<ClusterRecord>,
    /// Profiles (upserted).
    pub profiles: Vec<ProfileSpec>,
    /// Groups (upserted).
    pub groups: Vec<GroupSpec>,
    /// Machine patches (upserted).
    pub machine_patches: Vec<(MachineId, MachinePatches)>,
}

/// Declared config objects, machine patches, served configs and provisioning windows.
#[async_trait]
pub trait ConfigStore: Send + Sync + 'static {
    /// Upsert clusters, profiles, groups and machine patches, with events, in one transaction.
    async fn put_config_objects(
        &self,
        write: &ConfigWrite,
        events: &[NewEvent],
    ) -> Result<(), StoreError>;
    /// All clusters.
    async fn clusters(&self) -> Result<Vec<ClusterRecord>, StoreError>;
    /// All profiles.
    async fn profiles(&self) -> Result<Vec<ProfileSpec>, StoreError>;
    /// All groups.
    async fn groups(&self) -> Result<Vec<GroupSpec>, StoreError>;
    /// A machine's patches and the config it was last served.
    async fn machine_config(
        &self,
        id: MachineId,
    ) -> Result<(MachinePatches, Option<ServedConfig>), StoreError>;
    /// Patches of every machine that has some.
    async fn all_machine_patches(&self) -> Result<Vec<(MachineId, MachinePatches)>, StoreError>;
    /// Use the window's token `token_sha256` (once: only if it is still the window's token and
    /// unused) and remember what was served, with its event, in one transaction; false (nothing
    /// written) when the token was used already or replaced.
    async fn record_served(
        &self,
        id: MachineId,
        token_sha256: &str,
        served: &ServedConfig,
        event: &NewEvent,
    ) -> Result<bool, StoreError>;
    /// Open (or replace) a machine's window, with its event.
    async fn put_window(&self, w: &ProvisionWindow, event: &NewEvent) -> Result<(), StoreError>;
    /// A machine's window, open or not.
    async fn window(&self, id: MachineId) -> Result<Option<ProvisionWindow>, StoreError>;
    /// Set the token of the latest install boot, minted for a script request from `ip`, only
    /// while the window is open at `now` (unused, replacing any earlier token).
    async fn set_window_token(
        &self,
        id: MachineId,
        token_sha256: &str,
        ip: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
    /// Close an open window, with its event; false when none was open.
    async fn close_window(
        &self,
        id: MachineId,
        now: DateTime<Utc>,
        reason: &str,
        event: &NewEvent,
    ) -> Result<bool, StoreError>;
    /// The approval state of `id`'s open window (`None`: no open window).
    async fn approval(&self, id: MachineId) -> Result<Option<Approval>, StoreError>;
    /// Give `id`'s open window this boot's approval code (hash), unapproved; false when no
    /// window is open.
    async fn set_approval_code(&self, id: MachineId, code_sha256: &str)
        -> Result<bool, StoreError>;
    /// Approve the release of `id`'s config for the boot whose code hashes to `code_sha256`, with
    /// its event; false when no open window awaits approval with that code.
    async fn approve(
        &self,
        id: MachineId,
        code_sha256: &str,
        now: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<bool, StoreError>;
}

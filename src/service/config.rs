//! Talos machine configs as a use case: the declared clusters, profiles and groups (loaded by
//! `plinth apply`), rendering one machine's config from them, and handing it out only inside the
//! machine's provisioning window, to the request that carries the token minted into its latest
//! install boot.
//!
//! Rendering order: base config of the role (generated from the cluster's secrets bundle, or the
//! base config the cluster provides) -> cluster patches -> role patches -> site -> rack -> profile
//! (hardware) -> machine patches -> the machine's facts (hostname, install disk pinned by serial or
//! WWID, installer image, boot NIC). Every rendered config is validated (Talos JSON schema of its
//! version when one is configured, and Talos' own rules) before anyone sees it.
//!
//! This module imports `domain`, `talos` and the rest of `service`; nothing from `store`, `http` or
//! the front doors. It never logs a config or a token.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use base64::Engine as _;
use chrono::{DateTime, Duration, Utc};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::store::{InventoryStore, NewEvent, StoreError};
use crate::domain::{LifecycleState, Machine, MachineId, MachineSpec, Role};
use crate::talos::disk::{plan_install_disk, DiskRules, InstallSelector};
use crate::talos::patch::load_patch;
use crate::talos::render::{render, Installer, Layer, MachineFacts, RenderInput};
use crate::talos::schematic::SchematicId;
use crate::talos::secrets::SecretsBundle;
use crate::talos::validate::{check_semantics, SchemaValidator, Severity};
use crate::talos::{MachineConfig, TalosVersion};

/// Image Factory host used for installer images when a cluster names none.
pub const DEFAULT_FACTORY_HOST: &str = "factory.talos.dev";

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
    pub reinstall: Option<super::workflow::ReinstallPolicy>,
    /// How etcd is bootstrapped: `auto` (default) or `manual`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<super::clusters::BootstrapMode>,
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

/// A cluster's secret input, in the clear (only ever in memory).
#[derive(Clone, PartialEq, Eq)]
pub enum ClusterSecretInput {
    /// A secrets bundle (`talosctl gen secrets`, `plinth cluster init`): base configs are generated.
    Bundle(String),
    /// Base configs (`talosctl gen config`) used as they are.
    BaseConfigs {
        /// controlplane.yaml.
        controlplane: String,
        /// worker.yaml.
        worker: String,
    },
}

impl std::fmt::Debug for ClusterSecretInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClusterSecretInput::Bundle(_) => "Bundle(<redacted>)",
            ClusterSecretInput::BaseConfigs { .. } => "BaseConfigs(<redacted>)",
        })
    }
}

impl ClusterSecretInput {
    /// SHA-256 fingerprint, to tell in a diff whether the secrets changed.
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        match self {
            ClusterSecretInput::Bundle(b) => {
                h.update(b"bundle\0");
                h.update(b.as_bytes());
            }
            ClusterSecretInput::BaseConfigs {
                controlplane,
                worker,
            } => {
                h.update(b"base\0");
                h.update(controlplane.as_bytes());
                h.update(b"\0");
                h.update(worker.as_bytes());
            }
        }
        hex::encode(h.finalize())
    }
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

/// What the config use cases need from a database.
#[async_trait]
pub trait ConfigStore: Send + Sync {
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
    /// Remember what was served, with its event, in one transaction.
    async fn record_served(
        &self,
        id: MachineId,
        served: &ServedConfig,
        event: &NewEvent,
    ) -> Result<(), StoreError>;
    /// Open (or replace) a machine's window, with its event.
    async fn put_window(&self, w: &ProvisionWindow, event: &NewEvent) -> Result<(), StoreError>;
    /// A machine's window, open or not.
    async fn window(&self, id: MachineId) -> Result<Option<ProvisionWindow>, StoreError>;
    /// Set the token of the latest install boot, only while the window is open at `now`.
    async fn set_window_token(
        &self,
        id: MachineId,
        token_sha256: &str,
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
}

/// Why a config could not be rendered (or must not be served).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
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
    /// Declared data that does not make sense.
    #[error("{0}")]
    Declaration(String),
    /// The secrets could not be opened or generated from.
    #[error("cluster secrets: {0}")]
    Secrets(String),
    /// The install disk could not be decided.
    #[error("install disk: {0}")]
    Disk(String),
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

/// A rendered, validated config.
#[derive(Clone, PartialEq)]
pub struct RenderedMachine {
    /// The config, multi-document YAML.
    pub yaml: String,
    /// SHA-256 of `yaml`.
    pub sha256: String,
    /// Target Talos version.
    pub version: TalosVersion,
    /// Schematic of the kernel, initramfs and installer.
    pub schematic_id: String,
    /// Warnings (install disk not checkable, schema not configured, ...).
    pub warnings: Vec<String>,
    /// The install disk, described.
    pub install_disk: Option<String>,
    /// Extra kernel arguments: cluster, site, rack, profile, machine.
    pub kernel_args: Vec<String>,
    /// Wipe on install (profile).
    pub wipe: bool,
}

impl std::fmt::Debug for RenderedMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderedMachine")
            .field("sha256", &self.sha256)
            .field("version", &self.version)
            .field("warnings", &self.warnings)
            .finish_non_exhaustive()
    }
}

/// The inputs of renders, loaded once.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// Clusters by name.
    pub clusters: HashMap<String, ClusterRecord>,
    /// Profiles by name.
    pub profiles: HashMap<String, ProfileSpec>,
    /// Groups by (kind, name).
    pub groups: HashMap<(GroupKind, String), GroupSpec>,
}

impl Sources {
    /// From lists.
    pub fn new(
        clusters: Vec<ClusterRecord>,
        profiles: Vec<ProfileSpec>,
        groups: Vec<GroupSpec>,
    ) -> Self {
        Sources {
            clusters: clusters
                .into_iter()
                .map(|c| (c.spec.name.clone(), c))
                .collect(),
            profiles: profiles.into_iter().map(|p| (p.name.clone(), p)).collect(),
            groups: groups
                .into_iter()
                .map(|g| ((g.kind, g.name.clone()), g))
                .collect(),
        }
    }
}

/// The outcome of a config fetch that is not served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No such machine, or nothing may be served to it now: 404.
    NotFound,
    /// A window is open but the request does not prove it comes from the machine: 403.
    Forbidden,
}

/// What an install boot needs from the config side.
#[derive(Clone)]
pub struct InstallTicket {
    /// The token minted into this boot's kernel command line.
    pub token: String,
    /// Talos version, `v1.11.6`.
    pub talos_version: String,
    /// Schematic id.
    pub schematic_id: String,
    /// Extra kernel arguments.
    pub kernel_args: Vec<String>,
    /// Wipe the system disk on this boot.
    pub wipe: bool,
}

impl std::fmt::Debug for InstallTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstallTicket")
            .field("talos_version", &self.talos_version)
            .field("schematic_id", &self.schematic_id)
            .finish_non_exhaustive()
    }
}

/// Compiled schemas by Talos (major, minor).
type ValidatorCache = HashMap<(u32, u32), Arc<SchemaValidator>>;

/// Config use cases.
#[derive(Clone)]
pub struct ConfigService {
    store: Arc<dyn InventoryStore>,
    secrets: super::SecretBox,
    schema_dir: Option<PathBuf>,
    validators: Arc<Mutex<ValidatorCache>>,
}

/// SHA-256 of a token, hex.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn sealed_context(kind: &str, name: &str) -> String {
    format!("plinth/{kind}/{name}")
}

impl ConfigService {
    /// Over `store`, sealing with `secrets`, validating against the schemas in `schema_dir`
    /// (`config.schema.v<major>.<minor>[.<patch>].json`).
    pub fn new(
        store: Arc<dyn InventoryStore>,
        secrets: super::SecretBox,
        schema_dir: Option<PathBuf>,
    ) -> Self {
        ConfigService {
            store,
            secrets,
            schema_dir,
            validators: Arc::default(),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn InventoryStore> {
        &self.store
    }

    /// Seal a cluster's secret input into a record.
    pub fn seal_cluster(
        &self,
        spec: ClusterSpec,
        input: &ClusterSecretInput,
    ) -> Result<ClusterRecord, ConfigError> {
        let name = spec.name.clone();
        let fingerprint = input.fingerprint();
        let (sealed_bundle, sealed_base) = match input {
            ClusterSecretInput::Bundle(b) => {
                SecretsBundle::parse(b).map_err(|e| ConfigError::Secrets(e.to_string()))?;
                (
                    Some(
                        self.secrets
                            .seal(&sealed_context("cluster-bundle", &name), b.as_bytes()),
                    ),
                    None,
                )
            }
            ClusterSecretInput::BaseConfigs {
                controlplane,
                worker,
            } => {
                for (role, text) in [("controlplane", controlplane), ("worker", worker)] {
                    MachineConfig::parse(text).map_err(|e| {
                        ConfigError::Secrets(format!("base config for {role}: {e}"))
                    })?;
                }
                (
                    None,
                    Some((
                        self.secrets.seal(
                            &sealed_context("cluster-base-controlplane", &name),
                            controlplane.as_bytes(),
                        ),
                        self.secrets.seal(
                            &sealed_context("cluster-base-worker", &name),
                            worker.as_bytes(),
                        ),
                    )),
                )
            }
        };
        Ok(ClusterRecord {
            spec,
            sealed_bundle,
            sealed_base,
            secrets_sha256: fingerprint,
        })
    }

    /// A cluster's secret input, in the clear (for signing credentials from its CAs).
    pub fn cluster_secret_input(
        &self,
        cluster: &ClusterRecord,
    ) -> Result<ClusterSecretInput, ConfigError> {
        let name = &cluster.spec.name;
        if let Some(sealed) = &cluster.sealed_bundle {
            let text = self.open_text(&sealed_context("cluster-bundle", name), sealed)?;
            return Ok(ClusterSecretInput::Bundle(text));
        }
        if let Some((cp, w)) = &cluster.sealed_base {
            return Ok(ClusterSecretInput::BaseConfigs {
                controlplane: self
                    .open_text(&sealed_context("cluster-base-controlplane", name), cp)?,
                worker: self.open_text(&sealed_context("cluster-base-worker", name), w)?,
            });
        }
        Err(ConfigError::Secrets(format!(
            "cluster `{name}` has neither a secrets bundle nor base configs"
        )))
    }

    /// Load every render input from the store.
    pub async fn sources(&self) -> Result<Sources, ConfigError> {
        Ok(Sources::new(
            self.store.clusters().await?,
            self.store.profiles().await?,
            self.store.groups().await?,
        ))
    }

    fn open_text(&self, context: &str, sealed: &[u8]) -> Result<String, ConfigError> {
        let plain = self
            .secrets
            .open(context, sealed)
            .map_err(|e| ConfigError::Secrets(e.to_string()))?;
        String::from_utf8(plain).map_err(|_| ConfigError::Secrets("not UTF-8".into()))
    }

    fn base_config(
        &self,
        cluster: &ClusterRecord,
        role: Role,
        version: TalosVersion,
    ) -> Result<MachineConfig, ConfigError> {
        let name = &cluster.spec.name;
        if let Some((cp, w)) = &cluster.sealed_base {
            let (ctx, sealed) = match role {
                Role::ControlPlane => ("cluster-base-controlplane", cp),
                Role::Worker => ("cluster-base-worker", w),
            };
            let text = self.open_text(&sealed_context(ctx, name), sealed)?;
            return MachineConfig::parse(&text)
                .map_err(|e| ConfigError::Secrets(format!("base config: {e}")));
        }
        let Some(sealed) = &cluster.sealed_bundle else {
            return Err(ConfigError::Secrets(format!(
                "cluster `{name}` has neither a secrets bundle nor base configs"
            )));
        };
        let text = self.open_text(&sealed_context("cluster-bundle", name), sealed)?;
        let bundle =
            SecretsBundle::parse(&text).map_err(|e| ConfigError::Secrets(e.to_string()))?;
        generate_base(&bundle, role, &cluster.spec, version)
    }

    fn validator(&self, version: TalosVersion) -> Result<Option<Arc<SchemaValidator>>, String> {
        let Some(dir) = &self.schema_dir else {
            return Ok(None);
        };
        let key = (version.major, version.minor);
        if let Ok(cache) = self.validators.lock() {
            if let Some(v) = cache.get(&key) {
                return Ok(Some(v.clone()));
            }
        }
        let path = schema_file(dir, version)?;
        let v = Arc::new(SchemaValidator::load(&path, version).map_err(|e| e.to_string())?);
        if let Ok(mut cache) = self.validators.lock() {
            cache.insert(key, v.clone());
        }
        Ok(Some(v))
    }

    /// Render and validate the config of a machine described by `spec`, from `sources` and the
    /// machine's own patches.
    pub fn render_spec(
        &self,
        spec: &MachineSpec,
        own: &MachinePatches,
        sources: &Sources,
    ) -> Result<RenderedMachine, ConfigError> {
        let cluster_name = spec.cluster.as_deref().ok_or(ConfigError::NoCluster)?;
        let cluster = sources
            .clusters
            .get(cluster_name)
            .ok_or_else(|| ConfigError::UnknownCluster(cluster_name.to_string()))?;
        let role = spec.role.ok_or(ConfigError::NoRole)?;
        let version: TalosVersion = cluster
            .spec
            .talos_version
            .parse()
            .map_err(|e: crate::talos::VersionError| ConfigError::Declaration(e.to_string()))?;
        let profile = match spec.profile.as_deref() {
            Some(p) => Some(
                sources
                    .profiles
                    .get(p)
                    .ok_or_else(|| ConfigError::UnknownProfile(p.to_string()))?,
            ),
            None => None,
        };
        let site = spec
            .site
            .as_ref()
            .and_then(|s| sources.groups.get(&(GroupKind::Site, s.clone())));
        let rack = spec
            .rack
            .as_ref()
            .and_then(|r| sources.groups.get(&(GroupKind::Rack, r.clone())));

        let base = self.base_config(cluster, role, version)?;
        let role_patches = match role {
            Role::ControlPlane => &cluster.spec.role_patches.controlplane,
            Role::Worker => &cluster.spec.role_patches.worker,
        };
        let mut named: Vec<(String, &[PatchSource])> = vec![
            ("cluster".into(), &cluster.spec.patches),
            (format!("role:{role}"), role_patches),
        ];
        if let Some(g) = site {
            named.push((format!("site:{}", g.name), &g.patches));
        }
        if let Some(g) = rack {
            named.push((format!("rack:{}", g.name), &g.patches));
        }
        if let Some(p) = profile {
            named.push((format!("profile:{}", p.name), &p.patches));
        }
        named.push(("machine".into(), &own.patches));
        let mut layers = Vec::new();
        for (name, patches) in named {
            let mut loaded = Vec::new();
            for p in patches {
                loaded.push(load_patch(&p.text).map_err(|e| {
                    ConfigError::Render(format!("layer {name}, patch {}: {e}", p.origin))
                })?);
            }
            layers.push(Layer {
                name,
                patches: loaded,
            });
        }

        let mut warnings = Vec::new();
        let rules = profile.and_then(|p| p.install_disk.clone());
        let install_disk = match &rules {
            Some(r) => Some(
                plan_install_disk(r, &spec.disks, version)
                    .map_err(|e| ConfigError::Disk(e.to_string()))?,
            ),
            None => None,
        };
        let disk_text = install_disk
            .as_ref()
            .map(|p| match (&p.chosen, &p.selector) {
                (Some(c), _) => format!("disks[{}] pinned by {}", c.index, c.pin),
                (None, InstallSelector::DiskSelector(m)) => {
                    format!(
                        "Talos diskSelector {}",
                        serde_json::to_string(m).unwrap_or_default()
                    )
                }
                (None, InstallSelector::Cel(c)) => format!("Talos CEL selector {c}"),
            });
        let schematic = SchematicId::parse(&cluster.spec.schematic_id).ok_or_else(|| {
            ConfigError::Declaration(format!(
                "cluster `{}`: `{}` is not a schematic id",
                cluster.spec.name, cluster.spec.schematic_id
            ))
        })?;
        let installer = match &cluster.spec.install_image {
            Some(i) => Installer::Image(i.clone()),
            None => Installer::Factory {
                host: cluster.spec.factory_host.clone(),
                schematic,
            },
        };
        let wipe = profile.is_some_and(|p| p.wipe);
        let facts = MachineFacts {
            hostname: spec.hostname.clone(),
            install_disk,
            installer: Some(installer),
            boot_mac: spec.interfaces.iter().find(|i| i.boot).map(|i| i.mac),
            wipe: Some(wipe),
        };
        let rendered = render(&RenderInput {
            version,
            base: &base,
            layers: &layers,
            facts: &facts,
        })
        .map_err(|e| ConfigError::Render(e.to_string()))?;
        warnings.extend(rendered.warnings);

        let mut violations = match self.validator(version) {
            Ok(Some(v)) => v.check(&rendered.config),
            Ok(None) => {
                warnings.push(
                    "no Talos schema directory is configured ([talos] schema_dir): checked Talos' own rules only".into(),
                );
                Vec::new()
            }
            Err(e) => return Err(ConfigError::Invalid(vec![e])),
        };
        violations.extend(check_semantics(&rendered.config, version));
        let mut errors = Vec::new();
        for v in violations {
            let text = format!("{}: {}: {}", v.document, v.path, v.message);
            match v.severity {
                Severity::Error => errors.push(text),
                _ => warnings.push(text),
            }
        }
        if !errors.is_empty() {
            return Err(ConfigError::Invalid(errors));
        }
        let yaml = rendered
            .config
            .to_yaml()
            .map_err(|e| ConfigError::Render(e.to_string()))?;
        let mut kernel_args = cluster.spec.kernel_args.clone();
        for g in [site, rack].into_iter().flatten() {
            kernel_args.extend(g.kernel_args.iter().cloned());
        }
        if let Some(p) = profile {
            kernel_args.extend(p.kernel_args.iter().cloned());
        }
        kernel_args.extend(own.kernel_args.iter().cloned());
        Ok(RenderedMachine {
            sha256: sha256_hex(yaml.as_bytes()),
            yaml,
            version,
            schematic_id: cluster.spec.schematic_id.clone(),
            warnings,
            install_disk: disk_text,
            kernel_args,
            wipe,
        })
    }

    /// Render a machine's config from what the store holds now.
    pub async fn render_machine(&self, m: &Machine) -> Result<RenderedMachine, ConfigError> {
        let sources = self.sources().await?;
        let (own, _) = self.store.machine_config(m.id).await?;
        self.render_spec(&m.spec(), &own, &sources)
    }

    /// The config last served to a machine, in the clear.
    pub async fn last_served(
        &self,
        id: MachineId,
    ) -> Result<Option<(String, DateTime<Utc>)>, ConfigError> {
        let (_, served) = self.store.machine_config(id).await?;
        match served {
            Some(s) => {
                let yaml = self.open_text(&sealed_context("served", &id.to_string()), &s.sealed)?;
                Ok(Some((yaml, s.at)))
            }
            None => Ok(None),
        }
    }

    /// Open a machine's provisioning window for `ttl`. The config must render and validate
    /// first; the machine moves to `provisioning`.
    pub async fn open_window(
        &self,
        inventory: &super::Inventory,
        id: MachineId,
        ttl: Duration,
        wipe: bool,
        actor: &str,
    ) -> Result<(ProvisionWindow, RenderedMachine), OpenError> {
        let m = inventory.get(id).await.map_err(OpenError::Service)?;
        let rendered = self.render_machine(&m).await.map_err(OpenError::Config)?;
        if m.state != LifecycleState::Provisioning {
            inventory
                .set_state(id, None, LifecycleState::Provisioning, None, actor)
                .await
                .map_err(OpenError::Service)?;
        }
        let now = Utc::now();
        let w = ProvisionWindow {
            machine_id: id,
            opened_at: now,
            expires_at: now + ttl,
            opened_by: actor.to_string(),
            wipe,
            token_sha256: None,
            token_minted_at: None,
            closed_at: None,
            close_reason: None,
        };
        let event = NewEvent {
            machine_id: Some(id),
            kind: "config.window_opened".into(),
            actor: actor.into(),
            detail: serde_json::json!({
                "expires_at": w.expires_at, "wipe": wipe, "config_sha256": rendered.sha256,
                "warnings": rendered.warnings,
            }),
        };
        self.store
            .put_window(&w, &event)
            .await
            .map_err(|e| OpenError::Config(e.into()))?;
        Ok((w, rendered))
    }

    /// Close a machine's window; false when none was open.
    pub async fn close_window(
        &self,
        id: MachineId,
        reason: &str,
        actor: &str,
    ) -> Result<bool, ConfigError> {
        let event = NewEvent {
            machine_id: Some(id),
            kind: "config.window_closed".into(),
            actor: actor.into(),
            detail: serde_json::json!({ "reason": reason }),
        };
        Ok(self
            .store
            .close_window(id, Utc::now(), reason, &event)
            .await?)
    }

    /// For an install boot of `m`: mint the token of this boot, when the window is open and the
    /// config renders. `Ok(None)`: no window is open.
    pub async fn install_ticket(&self, m: &Machine) -> Result<Option<InstallTicket>, ConfigError> {
        let now = Utc::now();
        let Some(w) = self.store.window(m.id).await? else {
            return Ok(None);
        };
        if !w.is_open(now) {
            return Ok(None);
        }
        let rendered = self.render_machine(m).await?;
        let mut raw = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        if !self
            .store
            .set_window_token(m.id, &token_hash(&token), now)
            .await?
        {
            return Ok(None);
        }
        Ok(Some(InstallTicket {
            token,
            talos_version: rendered.version.to_string(),
            schematic_id: rendered.schematic_id,
            kernel_args: rendered.kernel_args,
            wipe: w.wipe || rendered.wipe,
        }))
    }

    /// Serve the config of machine `id` to a request carrying `token`, the SMBIOS `uuid` Talos
    /// substituted, from address `from`. Every answer is an event.
    pub async fn fetch(
        &self,
        inventory: &super::Inventory,
        id: MachineId,
        token: Option<&str>,
        uuid: Option<&str>,
        from: IpAddr,
    ) -> Result<String, Refusal> {
        let Ok(m) = inventory.get(id).await else {
            return Err(Refusal::NotFound);
        };
        let now = Utc::now();
        let refuse = |refusal: Refusal, reason: &str| {
            let event = NewEvent {
                machine_id: Some(id),
                kind: "config.refused".into(),
                actor: "talos".into(),
                detail: serde_json::json!({ "reason": reason, "from": from.to_string(),
                    "status": if refusal == Refusal::NotFound { 404 } else { 403 } }),
            };
            let store = self.store.clone();
            async move {
                if let Err(e) = store.append_event(&event).await {
                    tracing::warn!(error = %e, "config fetch: event not written");
                }
                tracing::info!(machine = %id, %from, reason = event.detail["reason"].as_str().unwrap_or(""), "config refused");
                Err(refusal)
            }
        };
        let window = match self.store.window(id).await {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "config fetch: window look-up failed");
                return Err(Refusal::NotFound);
            }
        };
        let Some(w) = window.filter(|w| w.closed_at.is_none()) else {
            return refuse(Refusal::NotFound, "no open provisioning window").await;
        };
        if m.state != LifecycleState::Provisioning {
            return refuse(Refusal::NotFound, "machine is not provisioning").await;
        }
        if w.expires_at <= now {
            return refuse(Refusal::Forbidden, "provisioning window expired").await;
        }
        let token_ok = match (token, &w.token_sha256) {
            (Some(t), Some(h)) => constant_time_eq(token_hash(t).as_bytes(), h.as_bytes()),
            _ => false,
        };
        if !token_ok {
            return refuse(Refusal::Forbidden, "token does not match this boot's").await;
        }
        if let Some(want) = m.smbios_uuid {
            let got = uuid.and_then(|u| u.trim().parse::<uuid::Uuid>().ok());
            if got != Some(want) {
                return refuse(Refusal::Forbidden, "SMBIOS UUID does not match the machine").await;
            }
        }
        match self.expected_addresses(&m).await {
            Ok(addrs) if !addrs.is_empty() => {
                let ok = match from {
                    IpAddr::V4(v4) => addrs.contains(&v4),
                    IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some_and(|v4| addrs.contains(&v4)),
                };
                if !ok {
                    return refuse(
                        Refusal::Forbidden,
                        "source address is not the machine's leased or reserved address",
                    )
                    .await;
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "config fetch: lease look-up failed");
                return Err(Refusal::NotFound);
            }
        }
        let rendered = match self.render_machine(&m).await {
            Ok(r) => r,
            Err(e) => {
                let reason = e.to_string();
                let _ = inventory
                    .set_state(
                        id,
                        None,
                        LifecycleState::Failed,
                        Some(format!("config not served: {reason}")),
                        "plinth",
                    )
                    .await;
                return refuse(Refusal::NotFound, &format!("config invalid: {reason}")).await;
            }
        };
        let served = ServedConfig {
            sealed: self.secrets.seal(
                &sealed_context("served", &id.to_string()),
                rendered.yaml.as_bytes(),
            ),
            sha256: rendered.sha256.clone(),
            at: now,
        };
        let event = NewEvent {
            machine_id: Some(id),
            kind: "config.served".into(),
            actor: "talos".into(),
            detail: serde_json::json!({ "sha256": rendered.sha256, "from": from.to_string(),
                "talos_version": rendered.version.to_string() }),
        };
        if let Err(e) = self.store.record_served(id, &served, &event).await {
            tracing::error!(error = %e, "config fetch: could not record the served config");
            return Err(Refusal::NotFound);
        }
        tracing::info!(machine = %id, %from, sha256 = %rendered.sha256, "config served");
        Ok(rendered.yaml)
    }

    /// Addresses a request for `m`'s config may come from: its reserved addresses and its bound
    /// leases. Empty when Plinth hands out none of them.
    async fn expected_addresses(
        &self,
        m: &Machine,
    ) -> Result<HashSet<std::net::Ipv4Addr>, StoreError> {
        let mut out: HashSet<std::net::Ipv4Addr> =
            m.interfaces.iter().filter_map(|i| i.ipv4).collect();
        let now_ms = Utc::now().timestamp_millis();
        for i in &m.interfaces {
            for l in self.store.leases_of_mac(i.mac).await? {
                if l.state == super::LeaseState::Bound && l.expires_ms > now_ms {
                    out.insert(l.ip);
                }
            }
        }
        Ok(out)
    }
}

/// Why a window could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The machine or its state.
    #[error(transparent)]
    Service(super::ServiceError),
    /// The config does not render or validate.
    #[error(transparent)]
    Config(ConfigError),
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The schema file of `version` in `dir`: `config.schema.v<major>.<minor>[.<patch>].json`, the
/// highest patch release when several are present.
pub fn schema_file(dir: &Path, version: TalosVersion) -> Result<PathBuf, String> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| format!("Talos schema directory {}: {e}", dir.display()))?;
    let mut best: Option<(u32, PathBuf)> = None;
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(v) = name
            .strip_prefix("config.schema.")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let Ok(tv) = v.parse::<TalosVersion>() else {
            continue;
        };
        if tv.major == version.major
            && tv.minor == version.minor
            && best.as_ref().is_none_or(|(p, _)| tv.patch > *p)
        {
            best = Some((tv.patch, entry.path()));
        }
    }
    best.map(|(_, p)| p).ok_or_else(|| {
        format!(
            "no schema for Talos v{}.{} in {} (expected config.schema.v{}.{}.<patch>.json)",
            version.major,
            version.minor,
            dir.display(),
            version.major,
            version.minor
        )
    })
}

/// Replace secret values in a rendered config by a short fingerprint, so a diff shows that a
/// secret changed without showing it.
pub fn redact(yaml: &str) -> String {
    const SECRET_KEYS: &[&str] = &[
        "key",
        "token",
        "secret",
        "secretboxEncryptionSecret",
        "aescbcEncryptionSecret",
        "bootstrapToken",
    ];
    let mut out = String::with_capacity(yaml.len());
    for line in yaml.lines() {
        let trimmed = line.trim_start();
        let redacted = SECRET_KEYS.iter().find_map(|k| {
            let rest = trimmed.strip_prefix(k)?.strip_prefix(':')?;
            let v = rest.trim();
            (!v.is_empty() && v != "\"\"" && v != "''").then(|| {
                let indent = &line[..line.len() - trimmed.len()];
                format!(
                    "{indent}{k}: <redacted sha256:{}>",
                    &sha256_hex(v.as_bytes())[..12]
                )
            })
        });
        out.push_str(redacted.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// A unified diff of two configs, secrets redacted; empty when they are equal.
pub fn config_diff(before: Option<&str>, after: Option<&str>, label: &str) -> String {
    let a = before.map(redact).unwrap_or_default();
    let b = after.map(redact).unwrap_or_default();
    if a == b {
        return String::new();
    }
    similar::TextDiff::from_lines(&a, &b)
        .unified_diff()
        .context_radius(3)
        .header(&format!("{label} (before)"), &format!("{label} (after)"))
        .to_string()
}

/// The base config of `role` generated from a secrets bundle, as `talosctl gen config` writes it.
fn generate_base(
    bundle: &SecretsBundle,
    role: Role,
    spec: &ClusterSpec,
    version: TalosVersion,
) -> Result<MachineConfig, ConfigError> {
    let mut opts =
        crate::talos::generate::GenerateOptions::new(&spec.name, &spec.endpoint, version);
    opts.kubernetes_version = spec.kubernetes_version.clone();
    crate::talos::generate::generate(bundle, role, &opts)
        .map_err(|e| ConfigError::Secrets(format!("generating the base config: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_values_but_shows_changes() {
        let a = "machine:\n    token: abc.def\n    ca:\n        crt: CERT\n        key: SECRET1\n";
        let b = "machine:\n    token: abc.def\n    ca:\n        crt: CERT\n        key: SECRET2\n";
        let ra = redact(a);
        assert!(!ra.contains("SECRET1") && !ra.contains("abc.def"), "{ra}");
        assert!(ra.contains("crt: CERT"));
        let d = config_diff(Some(a), Some(b), "m1");
        assert!(d.contains("-        key: <redacted sha256:"), "{d}");
        assert!(!d.contains("SECRET"), "{d}");
        assert_eq!(config_diff(Some(a), Some(a), "m1"), "");
    }

    #[test]
    fn schema_file_picks_the_minor_release() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/talos/schemas");
        if !dir.exists() {
            return;
        }
        let p = schema_file(&dir, TalosVersion::new(1, 12, 3)).expect("schema");
        assert!(p.ends_with("config.schema.v1.12.11.json"), "{p:?}");
        let e = schema_file(&dir, TalosVersion::new(1, 14, 0)).expect_err("none");
        assert!(e.contains("no schema for Talos v1.14"), "{e}");
    }

    #[test]
    fn windows_open_and_close() {
        let now = Utc::now();
        let mut w = ProvisionWindow {
            machine_id: MachineId::new(),
            opened_at: now,
            expires_at: now + Duration::minutes(5),
            opened_by: "t".into(),
            wipe: false,
            token_sha256: None,
            token_minted_at: None,
            closed_at: None,
            close_reason: None,
        };
        assert!(w.is_open(now));
        assert!(!w.is_open(now + Duration::minutes(6)));
        w.closed_at = Some(now);
        assert!(!w.is_open(now));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}

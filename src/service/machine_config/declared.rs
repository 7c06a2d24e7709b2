//! The declared inputs of every render: sealing a cluster's secret input (a secrets bundle or
//! base configs) before it is stored, opening it again to build a role's base config, and loading
//! the clusters, profiles and groups at once (`Sources`). Patch texts are sealed too (they carry
//! credentials such as a WireGuard `privateKey` or a registry `password`): every patch is stored
//! as `plinth-sealed:v1:<base64>`, sealed for its origin, and opened as it is loaded; a patch
//! stored in the clear by an older Plinth is read as it is and sealed when next written. Never
//! logs a secret.

use std::collections::HashMap;

use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::{sealed_context, ConfigService, MachineConfigError};
use crate::domain::{MachineId, Role};
use crate::service::ports::{
    ClusterRecord, ClusterSpec, ConfigWrite, GroupKind, GroupSpec, MachinePatches, NewEvent,
    PatchSource, ProfileSpec,
};
use crate::talos::secrets::SecretsBundle;
use crate::talos::{MachineConfig, TalosVersion};

/// How a sealed patch text starts.
pub const SEALED_PATCH: &str = "plinth-sealed:v1:";

/// Image Factory host used for installer images when a cluster names none.
pub const DEFAULT_FACTORY_HOST: &str = "factory.talos.dev";

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

impl ConfigService {
    /// Seal a cluster's secret input into a record.
    pub fn seal_cluster(
        &self,
        spec: ClusterSpec,
        input: &ClusterSecretInput,
    ) -> Result<ClusterRecord, MachineConfigError> {
        let name = spec.name.clone();
        let fingerprint = input.fingerprint();
        let (sealed_bundle, sealed_base) = match input {
            ClusterSecretInput::Bundle(b) => {
                SecretsBundle::parse(b).map_err(|e| MachineConfigError::Secrets(e.to_string()))?;
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
                        MachineConfigError::Secrets(format!("base config for {role}: {e}"))
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

    /// Load every render input from the store.
    pub async fn sources(&self) -> Result<Sources, MachineConfigError> {
        let mut clusters = self.configs.clusters().await?;
        for c in &mut clusters {
            self.open_patches(&mut c.spec.patches)?;
            self.open_patches(&mut c.spec.role_patches.controlplane)?;
            self.open_patches(&mut c.spec.role_patches.worker)?;
        }
        let mut profiles = self.configs.profiles().await?;
        for p in &mut profiles {
            self.open_patches(&mut p.patches)?;
        }
        let mut groups = self.configs.groups().await?;
        for g in &mut groups {
            self.open_patches(&mut g.patches)?;
        }
        Ok(Sources::new(clusters, profiles, groups))
    }

    /// A machine's own patches as stored, opened.
    pub(super) async fn machine_patches(
        &self,
        id: MachineId,
    ) -> Result<MachinePatches, MachineConfigError> {
        let (mut own, _) = self.configs.machine_config(id).await?;
        self.open_patches(&mut own.patches)?;
        Ok(own)
    }

    /// Seal patch texts for storage (those sealed already stay as they are).
    fn seal_patches(&self, patches: &mut [PatchSource]) {
        for p in patches {
            if p.text.starts_with(SEALED_PATCH) {
                continue;
            }
            let sealed = self
                .secrets
                .seal(&sealed_context("patch", &p.origin), p.text.as_bytes());
            p.text = format!(
                "{SEALED_PATCH}{}",
                base64::engine::general_purpose::STANDARD.encode(sealed)
            );
        }
    }

    /// Open sealed patch texts (a text stored in the clear stays as it is).
    fn open_patches(&self, patches: &mut [PatchSource]) -> Result<(), MachineConfigError> {
        for p in patches {
            let Some(b64) = p.text.strip_prefix(SEALED_PATCH) else {
                continue;
            };
            let sealed = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|_| {
                    MachineConfigError::Secrets(format!(
                        "patch {}: sealed text is not base64",
                        p.origin
                    ))
                })?;
            p.text = self
                .open_text(&sealed_context("patch", &p.origin), &sealed)
                .map_err(|e| MachineConfigError::Secrets(format!("patch {}: {e}", p.origin)))?;
        }
        Ok(())
    }

    pub(super) fn open_text(
        &self,
        context: &str,
        sealed: &[u8],
    ) -> Result<String, MachineConfigError> {
        let plain = self
            .secrets
            .open(context, sealed)
            .map_err(|e| MachineConfigError::Secrets(e.to_string()))?;
        String::from_utf8(plain).map_err(|_| MachineConfigError::Secrets("not UTF-8".into()))
    }

    /// A cluster's secret input, in the clear (for signing credentials from its CAs).
    pub fn cluster_secret_input(
        &self,
        cluster: &ClusterRecord,
    ) -> Result<ClusterSecretInput, MachineConfigError> {
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
        Err(MachineConfigError::Secrets(format!(
            "cluster `{name}` has neither a secrets bundle nor base configs"
        )))
    }

    pub(super) fn base_config(
        &self,
        cluster: &ClusterRecord,
        role: Role,
        version: TalosVersion,
    ) -> Result<MachineConfig, MachineConfigError> {
        let name = &cluster.spec.name;
        if let Some((cp, w)) = &cluster.sealed_base {
            let (ctx, sealed) = match role {
                Role::ControlPlane => ("cluster-base-controlplane", cp),
                Role::Worker => ("cluster-base-worker", w),
            };
            let text = self.open_text(&sealed_context(ctx, name), sealed)?;
            return MachineConfig::parse(&text)
                .map_err(|e| MachineConfigError::Secrets(format!("base config: {e}")));
        }
        let Some(sealed) = &cluster.sealed_bundle else {
            return Err(MachineConfigError::Secrets(format!(
                "cluster `{name}` has neither a secrets bundle nor base configs"
            )));
        };
        let text = self.open_text(&sealed_context("cluster-bundle", name), sealed)?;
        let bundle =
            SecretsBundle::parse(&text).map_err(|e| MachineConfigError::Secrets(e.to_string()))?;
        generate_base(&bundle, role, &cluster.spec, version)
    }

    /// Patches of every machine that has some.
    pub async fn all_machine_patches(
        &self,
    ) -> Result<Vec<(MachineId, MachinePatches)>, MachineConfigError> {
        let mut all = self.configs.all_machine_patches().await?;
        for (_, p) in &mut all {
            self.open_patches(&mut p.patches)?;
        }
        Ok(all)
    }

    /// Upsert clusters, profiles, groups and machine patches, with their events, in one
    /// transaction.
    pub async fn put_config_objects(
        &self,
        write: &ConfigWrite,
        events: &[NewEvent],
    ) -> Result<(), MachineConfigError> {
        let mut sealed = write.clone();
        for c in &mut sealed.clusters {
            self.seal_patches(&mut c.spec.patches);
            self.seal_patches(&mut c.spec.role_patches.controlplane);
            self.seal_patches(&mut c.spec.role_patches.worker);
        }
        for p in &mut sealed.profiles {
            self.seal_patches(&mut p.patches);
        }
        for g in &mut sealed.groups {
            self.seal_patches(&mut g.patches);
        }
        for (_, m) in &mut sealed.machine_patches {
            self.seal_patches(&mut m.patches);
        }
        Ok(self.configs.put_config_objects(&sealed, events).await?)
    }
}

/// The base config of `role` generated from a secrets bundle, as `talosctl gen config` writes it.
fn generate_base(
    bundle: &SecretsBundle,
    role: Role,
    spec: &ClusterSpec,
    version: TalosVersion,
) -> Result<MachineConfig, MachineConfigError> {
    let mut opts =
        crate::talos::generate::GenerateOptions::new(&spec.name, &spec.endpoint, version);
    opts.kubernetes_version = spec.kubernetes_version.clone();
    crate::talos::generate::generate(bundle, role, &opts)
        .map_err(|e| MachineConfigError::Secrets(format!("generating the base config: {e}")))
}

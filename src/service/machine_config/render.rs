//! Rendering one machine's config: the layers in order (base config of the role, cluster, role,
//! site, rack, profile, machine patches), the machine's facts (hostname, install disk, installer,
//! boot NIC), then validation against the Talos JSON schema of its version (compiled once per
//! version) and Talos' own rules.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{sha256_hex, ConfigService, MachineConfigError, Sources};
use crate::domain::{Machine, MachineSpec, Role};
use crate::service::ports::{GroupKind, MachinePatches, PatchSource};
use crate::talos::disk::{plan_install_disk, InstallSelector};
use crate::talos::patch::{load_patch, Patch};
use crate::talos::render::{render, Installer, Layer, MachineFacts, RenderError, RenderInput};
use crate::talos::schematic::SchematicId;
use crate::talos::validate::{check_semantics, SchemaValidator, Severity};
use crate::talos::TalosVersion;

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
    /// The schematic's `customization.extraKernelArgs` (Image Factory's PXE line has them).
    pub schematic_kernel_args: Vec<String>,
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

/// Compiled schemas by Talos (major, minor).
pub(super) type ValidatorCache = HashMap<(u32, u32), Arc<SchemaValidator>>;

impl ConfigService {
    /// The schema of `version`: the configured schema directory's file for that release if it
    /// has one, else the schema embedded in the binary.
    fn validator(&self, version: TalosVersion) -> Result<Arc<SchemaValidator>, String> {
        let key = (version.major, version.minor);
        if let Ok(cache) = self.validators.lock() {
            if let Some(v) = cache.get(&key) {
                return Ok(v.clone());
            }
        }
        let configured = match &self.schema_dir {
            Some(dir) => schema_file(dir, version).ok(),
            None => None,
        };
        let v = match configured {
            Some(path) => SchemaValidator::load(&path, version),
            None => SchemaValidator::embedded(version),
        }
        .map_err(|e| e.to_string())?;
        let v = Arc::new(v);
        if let Ok(mut cache) = self.validators.lock() {
            cache.insert(key, v.clone());
        }
        Ok(v)
    }

    /// Render and validate the config of a machine described by `spec`, from `sources` and the
    /// machine's own patches.
    pub fn render_spec(
        &self,
        spec: &MachineSpec,
        own: &MachinePatches,
        sources: &Sources,
    ) -> Result<RenderedMachine, MachineConfigError> {
        let cluster_name = spec
            .cluster
            .as_deref()
            .ok_or(MachineConfigError::NoCluster)?;
        let cluster = sources
            .clusters
            .get(cluster_name)
            .ok_or_else(|| MachineConfigError::UnknownCluster(cluster_name.to_string()))?;
        let role = spec.role.ok_or(MachineConfigError::NoRole)?;
        let version: TalosVersion =
            cluster
                .spec
                .talos_version
                .parse()
                .map_err(
                    |e: crate::talos::VersionError| MachineConfigError::Cluster {
                        cluster: cluster.spec.name.clone(),
                        field: "talosVersion",
                        message: e.to_string(),
                    },
                )?;
        let profile = match spec.profile.as_deref() {
            Some(p) => Some(
                sources
                    .profiles
                    .get(p)
                    .ok_or_else(|| MachineConfigError::UnknownProfile(p.to_string()))?,
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
        // (layer, patch file, patch) for naming the layer that set a refused field.
        let mut origins: Vec<(String, String, Patch)> = Vec::new();
        for (name, patches) in named {
            let mut loaded = Vec::new();
            for p in patches {
                let patch = load_patch(&p.text).map_err(|e| MachineConfigError::Patch {
                    layer: name.clone(),
                    origin: p.origin.clone(),
                    message: e.to_string(),
                })?;
                origins.push((name.clone(), p.origin.clone(), patch.clone()));
                loaded.push(patch);
            }
            layers.push(Layer {
                name,
                patches: loaded,
            });
        }

        let mut warnings = Vec::new();
        let rules = profile.and_then(|p| p.install_disk.clone());
        let install_disk = match &rules {
            Some(r) => Some(plan_install_disk(r, &spec.disks, version).map_err(|e| {
                MachineConfigError::Disk {
                    rule: e.rule(),
                    message: e.to_string(),
                }
            })?),
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
            MachineConfigError::Cluster {
                cluster: cluster.spec.name.clone(),
                field: "schematicId",
                message: format!("`{}` is not a schematic id", cluster.spec.schematic_id),
            }
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
        .map_err(|e| match e {
            // Name the patch by its file, not by its place in the layer.
            RenderError::Patch {
                layer,
                index,
                source,
            } => MachineConfigError::Patch {
                origin: origins
                    .iter()
                    .filter(|(l, _, _)| *l == layer)
                    .nth(index)
                    .map_or_else(|| format!("{index}"), |(_, o, _)| o.clone()),
                layer,
                message: source.to_string(),
            },
            other => MachineConfigError::Render(other.to_string()),
        })?;
        warnings.extend(rendered.warnings);

        let mut violations = match self.validator(version) {
            Ok(v) => v.check(&rendered.config),
            Err(e) => return Err(MachineConfigError::Invalid(vec![e])),
        };
        violations.extend(check_semantics(&rendered.config, version));
        let mut errors = Vec::new();
        for v in violations {
            // The last layer whose patch touches the field set it; else the base config or
            // the machine's facts.
            let set_by = origins
                .iter()
                .rev()
                .find(|(_, _, p)| p.touches(&v.document, &v.path))
                .map(|(layer, origin, _)| format!("layer {layer} ({origin})"))
                .unwrap_or_else(|| "the base config or the machine's facts".into());
            let rule = if v.rule == "plinth" {
                "Plinth's own rule".to_string()
            } else {
                format!("Talos rule {}", v.rule)
            };
            let text = format!(
                "{}: {}: {} [set by {set_by}; {rule}]",
                v.document, v.path, v.message
            );
            match v.severity {
                Severity::Error => errors.push(text),
                _ => warnings.push(text),
            }
        }
        if !errors.is_empty() {
            return Err(MachineConfigError::Invalid(errors));
        }
        let yaml = rendered
            .config
            .to_yaml()
            .map_err(|e| MachineConfigError::Render(e.to_string()))?;
        let mut kernel_args = cluster.spec.kernel_args.clone();
        for g in [site, rack].into_iter().flatten() {
            kernel_args.extend(g.kernel_args.iter().cloned());
        }
        if let Some(p) = profile {
            kernel_args.extend(p.kernel_args.iter().cloned());
        }
        kernel_args.extend(own.kernel_args.iter().cloned());
        if !kernel_args.is_empty() {
            // Inventory kernel args go on the PXE line of the install boot. Whether they outlive
            // the installation depends on where Talos keeps a kernel line for this release and
            // boot loader: say so instead of dropping them silently.
            let install = rendered
                .config
                .v1alpha1()
                .and_then(|d| d.get("machine"))
                .and_then(|m| m.get("install"));
            let uki = version >= TalosVersion::new(1, 14, 0)
                || install
                    .and_then(|i| i.get("grubUseUKICmdline"))
                    .and_then(serde_yaml_ng::Value::as_bool)
                    == Some(true);
            let kept = install
                .and_then(|i| i.get("extraKernelArgs"))
                .and_then(serde_yaml_ng::Value::as_sequence)
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect::<Vec<_>>())
                .unwrap_or_default();
            let lost: Vec<&String> = kernel_args
                .iter()
                .filter(|a| uki || !kept.contains(&a.as_str()))
                .collect();
            if !lost.is_empty() {
                let list = lost
                    .iter()
                    .map(|a| a.as_str())
                    .collect::<Vec<_>>()
                    .join(" ");
                warnings.push(if uki {
                    format!("kernelArgs `{list}` apply to the install boot only: Talos {version} boots the kernel line built into its UKI (grubUseUKICmdline / systemd-boot) and cannot keep them; put arguments that must persist in the schematic's customization.extraKernelArgs")
                } else {
                    format!("kernelArgs `{list}` apply to the install boot only: to keep them after installation, also set machine.install.extraKernelArgs")
                });
            }
        }
        Ok(RenderedMachine {
            sha256: sha256_hex(yaml.as_bytes()),
            yaml,
            version,
            schematic_id: cluster.spec.schematic_id.clone(),
            warnings,
            install_disk: disk_text,
            kernel_args,
            schematic_kernel_args: cluster.spec.schematic_kernel_args.clone(),
            wipe,
        })
    }

    /// Render a machine's config from what the store holds now.
    pub async fn render_machine(&self, m: &Machine) -> Result<RenderedMachine, MachineConfigError> {
        let sources = self.sources().await?;
        let own = self.machine_patches(m.id).await?;
        self.render_spec(&m.spec(), &own, &sources)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

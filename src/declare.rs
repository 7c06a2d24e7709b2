//! The declarative inventory directory (`inventory/` in the repository is an example): YAML
//! documents of kind `Cluster`, `Profile`, `Site`, `Rack` and `Machine`, reviewable in Git, loaded
//! by `plinth apply`. Patch files are referenced by path (relative to the document's file) or
//! written inline; files under a `patches/` directory are only read when referenced. Secrets are
//! never in the directory: a cluster names its secrets bundle (`talosctl gen secrets`, `plinth
//! cluster init`) or base configs (`talosctl gen config`) by a path outside it.
//!
//! Reads files and turns them into service types; writes nothing. Imports `domain`, `service`
//! types and `talos::schematic`; never `store` or a front door.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml_ng::Value;

use crate::domain::MachineSpec;
use crate::service::apply::{Declared, DeclaredMachine};
use crate::service::machine_config::DEFAULT_FACTORY_HOST;
use crate::service::{
    ClusterSecretInput, ClusterSpec, GroupKind, GroupSpec, MachinePatches, PatchSource, ProfileSpec,
};
use crate::talos::disk::DiskRules;
use crate::talos::schematic::Schematic;

#[derive(Deserialize)]
#[serde(untagged)]
enum PatchRef {
    File(String),
    Inline(Value),
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RolePatchRefs {
    #[serde(default)]
    controlplane: Vec<PatchRef>,
    #[serde(default)]
    worker: Vec<PatchRef>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BaseConfigPaths {
    controlplane: String,
    worker: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClusterDoc {
    name: String,
    endpoint: String,
    talos_version: String,
    #[serde(default)]
    kubernetes_version: Option<String>,
    /// The Image Factory schematic (`customization: ...`), or give `schematicId`.
    #[serde(default)]
    schematic: Option<Value>,
    #[serde(default)]
    schematic_id: Option<String>,
    #[serde(default)]
    factory: Option<String>,
    #[serde(default)]
    install_image: Option<String>,
    #[serde(default)]
    secrets: Option<String>,
    #[serde(default)]
    base_configs: Option<BaseConfigPaths>,
    #[serde(default)]
    patches: Vec<PatchRef>,
    #[serde(default)]
    role_patches: RolePatchRefs,
    #[serde(default)]
    kernel_args: Vec<String>,
    #[serde(default)]
    reinstall: Option<crate::service::ReinstallPolicy>,
    /// `auto` (default) or `manual`.
    #[serde(default)]
    bootstrap: Option<crate::service::ports::configs::BootstrapMode>,
    /// `token` (default) or `approve`.
    #[serde(default)]
    delivery: Option<crate::service::ports::configs::Delivery>,
    /// Rolling upgrade policy.
    #[serde(default)]
    upgrade: Option<crate::service::ports::upgrades::UpgradePolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProfileDoc {
    name: String,
    #[serde(default)]
    patches: Vec<PatchRef>,
    #[serde(default)]
    kernel_args: Vec<String>,
    #[serde(default)]
    install_disk: Option<DiskRules>,
    #[serde(default)]
    wipe: bool,
    #[serde(default)]
    boot_target: Option<String>,
    #[serde(default)]
    boot_media_url: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GroupDoc {
    name: String,
    #[serde(default)]
    patches: Vec<PatchRef>,
    #[serde(default)]
    kernel_args: Vec<String>,
}

struct Loader {
    root: PathBuf,
    errors: Vec<String>,
    out: Declared,
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') {
            continue;
        }
        if e.file_type()?.is_dir() {
            if name != "patches" {
                yaml_files(&p, out)?;
            }
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            out.push(p);
        }
    }
    Ok(())
}

/// Load a declarative inventory directory. Every problem is reported (file, document, field),
/// not just the first.
pub fn load(dir: &Path) -> Result<Declared, Vec<String>> {
    let root = std::fs::canonicalize(dir).map_err(|e| vec![format!("{}: {e}", dir.display())])?;
    let mut files = Vec::new();
    if let Err(e) = yaml_files(&root, &mut files) {
        return Err(vec![format!("{}: {e}", root.display())]);
    }
    let mut l = Loader {
        root,
        errors: Vec::new(),
        out: Declared::default(),
    };
    for f in files {
        l.file(&f);
    }
    l.check_duplicates();
    if l.errors.is_empty() {
        Ok(l.out)
    } else {
        Err(l.errors)
    }
}

impl Loader {
    fn rel(&self, p: &Path) -> String {
        p.strip_prefix(&self.root)
            .unwrap_or(p)
            .display()
            .to_string()
    }

    fn file(&mut self, path: &Path) {
        let name = self.rel(path);
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => return self.errors.push(format!("{name}: {e}")),
        };
        for (i, de) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
            let origin = format!("{name}#{}", i + 1);
            let doc = match Value::deserialize(de) {
                Ok(Value::Null) => continue,
                Ok(v) => v,
                Err(e) => {
                    self.errors.push(format!("{origin}: not YAML: {e}"));
                    break;
                }
            };
            self.document(path, &origin, doc);
        }
    }

    fn document(&mut self, path: &Path, origin: &str, doc: Value) {
        let Value::Mapping(mut m) = doc else {
            return self.errors.push(format!(
                "{origin}: a document must be a mapping with `kind`"
            ));
        };
        let kind = match m.remove("kind") {
            Some(Value::String(k)) => k,
            _ => {
                return self.errors.push(format!(
                    "{origin}: `kind` is missing: Cluster, Profile, Site, Rack or Machine"
                ))
            }
        };
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        let body = Value::Mapping(m);
        match kind.as_str() {
            "Cluster" => match serde_yaml_ng::from_value::<ClusterDoc>(body) {
                Ok(d) => self.cluster(&dir, origin, d),
                Err(e) => self.errors.push(format!("{origin}: Cluster: {e}")),
            },
            "Profile" => match serde_yaml_ng::from_value::<ProfileDoc>(body) {
                Ok(d) => {
                    let patches = self.patches(&dir, origin, "patches", d.patches);
                    if let Some(t) = &d.boot_target {
                        match t.parse::<crate::service::bmc::BootTarget>() {
                            Ok(crate::service::bmc::BootTarget::Cd)
                                if d.boot_media_url.is_none() =>
                            {
                                self.errors.push(format!(
                                    "{origin}: bootMediaUrl: required when bootTarget is cd (the ISO to insert as virtual media)"
                                ))
                            }
                            Ok(_) => {}
                            Err(e) => self.errors.push(format!("{origin}: bootTarget: {e}")),
                        }
                    }
                    self.out.profiles.push(ProfileSpec {
                        name: d.name,
                        patches,
                        kernel_args: d.kernel_args,
                        install_disk: d.install_disk,
                        wipe: d.wipe,
                        boot_target: d.boot_target,
                        boot_media_url: d.boot_media_url,
                    });
                }
                Err(e) => self.errors.push(format!("{origin}: Profile: {e}")),
            },
            "Site" | "Rack" => match serde_yaml_ng::from_value::<GroupDoc>(body) {
                Ok(d) => {
                    let patches = self.patches(&dir, origin, "patches", d.patches);
                    let kind = if kind == "Site" {
                        GroupKind::Site
                    } else {
                        GroupKind::Rack
                    };
                    self.out.groups.push(GroupSpec {
                        kind,
                        name: d.name,
                        patches,
                        kernel_args: d.kernel_args,
                    });
                }
                Err(e) => self.errors.push(format!("{origin}: {kind}: {e}")),
            },
            "Machine" => self.machine(&dir, origin, body),
            other => self.errors.push(format!(
                "{origin}: unknown kind `{other}`: Cluster, Profile, Site, Rack or Machine"
            )),
        }
    }

    fn patches(
        &mut self,
        dir: &Path,
        origin: &str,
        field: &str,
        refs: Vec<PatchRef>,
    ) -> Vec<PatchSource> {
        let mut out = Vec::new();
        for (i, r) in refs.into_iter().enumerate() {
            match r {
                PatchRef::File(f) => {
                    let p = dir.join(&f);
                    match std::fs::read_to_string(&p) {
                        Ok(text) => out.push(PatchSource {
                            origin: self.rel(&p),
                            text,
                        }),
                        Err(e) => self
                            .errors
                            .push(format!("{origin}: {field}[{i}]: {}: {e}", p.display())),
                    }
                }
                PatchRef::Inline(v) => match serde_yaml_ng::to_string(&v) {
                    Ok(text) => out.push(PatchSource {
                        origin: format!("{origin} {field}[{i}]"),
                        text,
                    }),
                    Err(e) => self.errors.push(format!("{origin}: {field}[{i}]: {e}")),
                },
            }
        }
        // Check each patch parses now, so errors name the file and not a later render.
        for p in &out {
            if let Err(e) = crate::talos::patch::load_patch(&p.text) {
                self.errors
                    .push(format!("{}: not a Talos patch: {e}", p.origin));
            }
        }
        out
    }

    fn secret_file(&mut self, dir: &Path, origin: &str, field: &str, p: &str) -> Option<String> {
        let path = dir.join(p);
        let Ok(canon) = std::fs::canonicalize(&path) else {
            self.errors.push(format!(
                "{origin}: {field}: {} cannot be read",
                path.display()
            ));
            return None;
        };
        if canon.starts_with(&self.root) {
            self.errors.push(format!(
                "{origin}: {field}: {} lies inside the inventory directory; keep secrets out of Git and name a path outside it",
                path.display()
            ));
            return None;
        }
        match std::fs::read_to_string(&canon) {
            Ok(t) => Some(t),
            Err(e) => {
                self.errors
                    .push(format!("{origin}: {field}: {}: {e}", path.display()));
                None
            }
        }
    }

    fn cluster(&mut self, dir: &Path, origin: &str, d: ClusterDoc) {
        if let Err(e) = d.talos_version.parse::<crate::talos::TalosVersion>() {
            self.errors.push(format!("{origin}: talosVersion: {e}"));
        }
        if let Some(u) = &d.upgrade {
            if u.max_workers_per_rack == Some(0) {
                self.errors.push(format!(
                    "{origin}: upgrade.maxWorkersPerRack: must be at least 1 (a rollout must be able to upgrade a worker)"
                ));
            }
            if u.node_timeout_seconds
                .is_some_and(|s| !(5..=86_400).contains(&s))
            {
                self.errors.push(format!(
                    "{origin}: upgrade.nodeTimeoutSeconds: must be between 5 and 86400 (a node pulls an image, installs and reboots within it)"
                ));
            }
            if u.snapshot_max_age_seconds
                .is_some_and(|s| !(60..=7 * 86_400).contains(&s))
            {
                self.errors.push(format!(
                    "{origin}: upgrade.snapshotMaxAgeSeconds: must be between 60 and 604800 (7 days)"
                ));
            }
        }
        match url_host(&d.endpoint) {
            Ok(()) => {}
            Err(e) => self.errors.push(format!("{origin}: endpoint: {e}")),
        }
        let schematic_id = match (&d.schematic, &d.schematic_id) {
            (Some(_), Some(_)) => {
                self.errors.push(format!(
                    "{origin}: give `schematic` or `schematicId`, not both"
                ));
                return;
            }
            (Some(s), None) => {
                let text = serde_yaml_ng::to_string(s).unwrap_or_default();
                match Schematic::parse(&text).and_then(|s| s.id()) {
                    Ok(id) => id.as_str().to_string(),
                    Err(e) => {
                        self.errors.push(format!("{origin}: schematic: {e}"));
                        return;
                    }
                }
            }
            (None, Some(id)) => {
                if crate::talos::schematic::SchematicId::parse(id).is_none() {
                    self.errors.push(format!(
                        "{origin}: schematicId: `{id}` is not 64 lower-case hex digits"
                    ));
                    return;
                }
                id.clone()
            }
            (None, None) => match Schematic::parse("customization: {}\n").and_then(|s| s.id()) {
                Ok(id) => id.as_str().to_string(),
                Err(e) => {
                    self.errors.push(format!("{origin}: schematic: {e}"));
                    return;
                }
            },
        };
        let secret = match (&d.secrets, &d.base_configs) {
            (Some(_), Some(_)) => {
                self.errors.push(format!(
                    "{origin}: give `secrets` or `baseConfigs`, not both"
                ));
                None
            }
            (Some(p), None) => self
                .secret_file(dir, origin, "secrets", p)
                .map(ClusterSecretInput::Bundle),
            (None, Some(b)) => {
                let cp = self.secret_file(dir, origin, "baseConfigs.controlplane", &b.controlplane);
                let w = self.secret_file(dir, origin, "baseConfigs.worker", &b.worker);
                cp.zip(w)
                    .map(|(controlplane, worker)| ClusterSecretInput::BaseConfigs {
                        controlplane,
                        worker,
                    })
            }
            (None, None) => {
                self.errors.push(format!(
                    "{origin}: name the cluster's `secrets` bundle (talosctl gen secrets or plinth cluster init) or its `baseConfigs`, as paths outside the directory"
                ));
                None
            }
        };
        let patches = self.patches(dir, origin, "patches", d.patches);
        let cp = self.patches(
            dir,
            origin,
            "rolePatches.controlplane",
            d.role_patches.controlplane,
        );
        let worker = self.patches(dir, origin, "rolePatches.worker", d.role_patches.worker);
        let Some(secret) = secret else { return };
        self.out.clusters.push((
            ClusterSpec {
                name: d.name,
                endpoint: d.endpoint,
                talos_version: d.talos_version,
                kubernetes_version: d.kubernetes_version,
                schematic_id,
                factory_host: d
                    .factory
                    .unwrap_or_else(|| DEFAULT_FACTORY_HOST.to_string()),
                install_image: d.install_image,
                patches,
                role_patches: crate::service::ports::RolePatches {
                    controlplane: cp,
                    worker,
                },
                kernel_args: d.kernel_args,
                reinstall: d.reinstall,
                bootstrap: d.bootstrap,
                delivery: d.delivery,
                upgrade: d.upgrade,
            },
            secret,
        ));
    }

    fn machine(&mut self, dir: &Path, origin: &str, body: Value) {
        let Value::Mapping(mut m) = body else { return };
        let patch_refs = m.remove("patches");
        let kernel_args = m.remove("kernelArgs");
        let refs: Vec<PatchRef> = match patch_refs.map(serde_yaml_ng::from_value) {
            None => Vec::new(),
            Some(Ok(r)) => r,
            Some(Err(e)) => return self.errors.push(format!("{origin}: patches: {e}")),
        };
        let kernel_args: Vec<String> = match kernel_args.map(serde_yaml_ng::from_value) {
            None => Vec::new(),
            Some(Ok(k)) => k,
            Some(Err(e)) => return self.errors.push(format!("{origin}: kernelArgs: {e}")),
        };
        let json = match serde_json::to_value(Value::Mapping(m)) {
            Ok(j) => j,
            Err(e) => return self.errors.push(format!("{origin}: {e}")),
        };
        let spec: MachineSpec = match serde_path_to_error::deserialize(json) {
            Ok(s) => s,
            Err(e) => {
                return self
                    .errors
                    .push(format!("{origin}: {}: {}", e.path(), e.inner()))
            }
        };
        if spec.hostname.is_none() {
            return self.errors.push(format!(
                "{origin}: hostname: required (it is the machine's key in the directory)"
            ));
        }
        if spec.bmc.as_ref().is_some_and(|b| b.password.is_some()) {
            return self.errors.push(format!(
                "{origin}: bmc.password: secrets are not kept in the inventory directory; set it with `plinth machine edit --set bmc.password=...`"
            ));
        }
        let spec = match spec.validate() {
            Ok(s) => s,
            Err(e) => return self.errors.push(format!("{origin}: {e}")),
        };
        let patches = self.patches(dir, origin, "patches", refs);
        self.out.machines.push(DeclaredMachine {
            origin: origin.to_string(),
            spec,
            patches: MachinePatches {
                patches,
                kernel_args,
            },
        });
    }

    fn check_duplicates(&mut self) {
        let mut seen = std::collections::HashSet::new();
        let names =
            self.out
                .clusters
                .iter()
                .map(|(c, _)| format!("Cluster {}", c.name))
                .chain(
                    self.out
                        .profiles
                        .iter()
                        .map(|p| format!("Profile {}", p.name)),
                )
                .chain(
                    self.out
                        .groups
                        .iter()
                        .map(|g| format!("{} {}", g.kind.as_str(), g.name)),
                )
                .chain(self.out.machines.iter().map(|m| {
                    format!("Machine {}", m.spec.hostname.as_deref().unwrap_or_default())
                }));
        let mut dups = Vec::new();
        for n in names {
            if !seen.insert(n.clone()) {
                dups.push(format!("{n} is declared twice"));
            }
        }
        self.errors.extend(dups);
    }
}

fn url_host(endpoint: &str) -> Result<(), String> {
    let rest = endpoint.strip_prefix("https://").ok_or_else(|| {
        format!("`{endpoint}` must be an https:// URL, e.g. https://10.0.0.10:6443")
    })?;
    if rest.trim_end_matches('/').is_empty() {
        return Err(format!("`{endpoint}` names no host"));
    }
    Ok(())
}

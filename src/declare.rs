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
use crate::service::apply::{Declared, DeclaredMachine, DocLocation};
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
    /// `{every: 6h, keep: 28, store: s3://bucket/prefix | file:///path}`.
    #[serde(default)]
    etcd_snapshots: Option<crate::domain::snapshots::SnapshotPolicy>,
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

/// Load a declarative inventory directory. Every problem is reported as `file:line: field:
/// message` (the line of the field in its YAML document), not just the first.
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
        let mut lines = document_lines(&text).into_iter();
        for (i, de) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
            let (start, fields) = lines.next().unwrap_or_default();
            let loc = DocLocation {
                file: name.clone(),
                index: i + 1,
                start: start.max(1),
                lines: fields,
            };
            let doc = match Value::deserialize(de) {
                Ok(Value::Null) => continue,
                Ok(v) => v,
                Err(e) => {
                    let at = e.location().map_or_else(
                        || format!("{name}#{}", i + 1),
                        |l| format!("{name}:{}", l.line()),
                    );
                    self.errors.push(format!("{at}: not YAML: {e}"));
                    break;
                }
            };
            self.document(path, &loc, doc);
        }
    }

    /// Record a problem of `field` (a path in the document; empty for the whole document).
    fn error(&mut self, loc: &DocLocation, field: &str, message: impl std::fmt::Display) {
        if field.is_empty() {
            self.errors.push(format!("{}: {message}", loc.at(field)));
        } else {
            self.errors
                .push(format!("{}: {field}: {message}", loc.at(field)));
        }
    }

    /// Deserialize a document's body into `T`, or record where and why it does not fit.
    fn typed<'de, T: Deserialize<'de>, D: serde::Deserializer<'de>>(
        &mut self,
        loc: &DocLocation,
        kind: &str,
        body: D,
    ) -> Option<T> {
        match serde_path_to_error::deserialize::<_, T>(body) {
            Ok(d) => Some(d),
            Err(e) => {
                let mut field = e.path().to_string();
                if field == "." {
                    field.clear();
                }
                let message = e.into_inner().to_string();
                // An unknown field is reported at its parent: point at the field itself.
                if let Some(unknown) = message
                    .strip_prefix("unknown field `")
                    .and_then(|r| r.split('`').next())
                    .filter(|u| field != *u && !field.ends_with(&format!(".{u}")))
                {
                    field = if field.is_empty() {
                        unknown.to_string()
                    } else {
                        format!("{field}.{unknown}")
                    };
                }
                self.error(loc, &field, format!("{kind}: {message}"));
                None
            }
        }
    }

    fn document(&mut self, path: &Path, loc: &DocLocation, doc: Value) {
        let Value::Mapping(mut m) = doc else {
            return self.error(loc, "", "a document must be a mapping with `kind`");
        };
        let kind = match m.remove("kind") {
            Some(Value::String(k)) => k,
            _ => {
                return self.error(
                    loc,
                    "kind",
                    "missing: Cluster, Profile, Site, Rack or Machine",
                )
            }
        };
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        let body = Value::Mapping(m);
        match kind.as_str() {
            "Cluster" => {
                if let Some(d) = self.typed::<ClusterDoc, _>(loc, "Cluster", body) {
                    self.locate("Cluster", &d.name, loc);
                    self.cluster(&dir, loc, d);
                }
            }
            "Profile" => {
                if let Some(d) = self.typed::<ProfileDoc, _>(loc, "Profile", body) {
                    self.locate("Profile", &d.name, loc);
                    let patches = self.patches(&dir, loc, "patches", d.patches);
                    if let Some(t) = &d.boot_target {
                        match t.parse::<crate::service::bmc::BootTarget>() {
                            Ok(crate::service::bmc::BootTarget::Cd)
                                if d.boot_media_url.is_none() =>
                            {
                                self.error(
                                    loc,
                                    "bootMediaUrl",
                                    "required when bootTarget is cd (the ISO to insert as virtual media)",
                                )
                            }
                            Ok(_) => {}
                            Err(e) => self.error(loc, "bootTarget", e),
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
            }
            "Site" | "Rack" => {
                if let Some(d) = self.typed::<GroupDoc, _>(loc, &kind, body) {
                    self.locate(&kind, &d.name, loc);
                    let patches = self.patches(&dir, loc, "patches", d.patches);
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
            }
            "Machine" => self.machine(&dir, loc, body),
            other => self.error(
                loc,
                "kind",
                format!("unknown kind `{other}`: Cluster, Profile, Site, Rack or Machine"),
            ),
        }
    }

    /// Remember where an object was written; a second declaration of it is an error.
    fn locate(&mut self, kind: &str, name: &str, loc: &DocLocation) {
        let key = (kind.to_string(), name.to_string());
        if let Some(first) = self.out.locations.objects.get(&key) {
            let first = first.at("");
            let field = if kind == "Machine" {
                "hostname"
            } else {
                "name"
            };
            return self.error(
                loc,
                field,
                format!("{kind} {name} is declared twice (first at {first})"),
            );
        }
        self.out.locations.objects.insert(key, loc.clone());
    }

    fn patches(
        &mut self,
        dir: &Path,
        loc: &DocLocation,
        field: &str,
        refs: Vec<PatchRef>,
    ) -> Vec<PatchSource> {
        let mut out = Vec::new();
        // (origin, where its text starts: a file, or `file:line` of an inline patch)
        let mut places = Vec::new();
        for (i, r) in refs.into_iter().enumerate() {
            let item = format!("{field}[{i}]");
            match r {
                PatchRef::File(f) => {
                    // Named as it lies in the directory (`patches/x.yaml`, not
                    // `clusters/../patches/x.yaml`).
                    let p = dir.join(&f);
                    let p = std::fs::canonicalize(&p).unwrap_or(p);
                    match std::fs::read_to_string(&p) {
                        Ok(text) => {
                            let origin = self.rel(&p);
                            places.push(origin.clone());
                            out.push(PatchSource { origin, text });
                        }
                        Err(e) => self.error(loc, &item, format!("{}: {e}", p.display())),
                    }
                }
                PatchRef::Inline(v) => match serde_yaml_ng::to_string(&v) {
                    Ok(text) => {
                        // The origin stays `file#document field[i]`: it is part of how a sealed
                        // value of the patch is bound, and must not move with the lines above it.
                        let origin = format!("{}#{} {item}", loc.file, loc.index);
                        let at = format!("{} ({item})", loc.at(&item));
                        self.out
                            .locations
                            .patches
                            .insert(origin.clone(), at.clone());
                        places.push(at);
                        out.push(PatchSource { origin, text });
                    }
                    Err(e) => self.error(loc, &item, e),
                },
            }
        }
        // Check each patch parses now, so errors name the file and not a later render.
        for (p, place) in out.iter().zip(places) {
            if let Err(e) = crate::talos::patch::load_patch(&p.text) {
                self.errors.push(format!("{place}: not a Talos patch: {e}"));
            }
        }
        out
    }

    fn secret_file(
        &mut self,
        dir: &Path,
        loc: &DocLocation,
        field: &str,
        p: &str,
    ) -> Option<String> {
        let path = dir.join(p);
        let Ok(canon) = std::fs::canonicalize(&path) else {
            self.error(loc, field, format!("{} cannot be read", path.display()));
            return None;
        };
        if canon.starts_with(&self.root) {
            self.error(
                loc,
                field,
                format!(
                    "{} lies inside the inventory directory; keep secrets out of Git and name a path outside it",
                    path.display()
                ),
            );
            return None;
        }
        match std::fs::read_to_string(&canon) {
            Ok(t) => Some(t),
            Err(e) => {
                self.error(loc, field, format!("{}: {e}", path.display()));
                None
            }
        }
    }

    fn cluster(&mut self, dir: &Path, loc: &DocLocation, d: ClusterDoc) {
        if let Err(e) = d.talos_version.parse::<crate::talos::TalosVersion>() {
            self.error(loc, "talosVersion", e);
        }
        if let Some(u) = &d.upgrade {
            if u.max_workers_per_rack == Some(0) {
                self.error(
                    loc,
                    "upgrade.maxWorkersPerRack",
                    "must be at least 1 (a rollout must be able to upgrade a worker)",
                );
            }
            if u.node_timeout_seconds
                .is_some_and(|s| !(5..=86_400).contains(&s))
            {
                self.error(
                    loc,
                    "upgrade.nodeTimeoutSeconds",
                    "must be between 5 and 86400 (a node pulls an image, installs and reboots within it)",
                );
            }
            if u.snapshot_max_age_seconds
                .is_some_and(|s| !(60..=7 * 86_400).contains(&s))
            {
                self.error(
                    loc,
                    "upgrade.snapshotMaxAgeSeconds",
                    "must be between 60 and 604800 (7 days)",
                );
            }
        }
        if let Err(e) = url_host(&d.endpoint) {
            self.error(loc, "endpoint", e);
        }
        // With only `schematicId`, Plinth cannot know the schematic's extra kernel arguments or
        // META values.
        let mut schematic_kernel_args = Vec::new();
        let schematic_id = match (&d.schematic, &d.schematic_id) {
            (Some(_), Some(_)) => {
                self.error(
                    loc,
                    "schematicId",
                    "give `schematic` or `schematicId`, not both",
                );
                return;
            }
            (Some(s), None) => {
                let text = serde_yaml_ng::to_string(s).unwrap_or_default();
                // The schematic's part of the PXE line as Image Factory writes it: its META
                // values (as `talos.environment`), then its extra kernel arguments.
                let version = d
                    .talos_version
                    .parse::<crate::talos::TalosVersion>()
                    .unwrap_or(crate::talos::TalosVersion::new(1, 14, 0));
                match Schematic::parse(&text).and_then(|s| {
                    let id = s.id()?;
                    let c = &s.customization;
                    let args = crate::talos::kernel::schematic_line_args(
                        version,
                        &c.meta,
                        &c.extra_kernel_args,
                    );
                    Ok((id, args))
                }) {
                    Ok((id, args)) => {
                        schematic_kernel_args = args;
                        id.as_str().to_string()
                    }
                    Err(e) => {
                        self.error(loc, "schematic", e);
                        return;
                    }
                }
            }
            (None, Some(id)) => {
                if crate::talos::schematic::SchematicId::parse(id).is_none() {
                    self.error(
                        loc,
                        "schematicId",
                        format!("`{id}` is not 64 lower-case hex digits"),
                    );
                    return;
                }
                id.clone()
            }
            (None, None) => match Schematic::parse("customization: {}\n").and_then(|s| s.id()) {
                Ok(id) => id.as_str().to_string(),
                Err(e) => {
                    self.error(loc, "schematic", e);
                    return;
                }
            },
        };
        let secret = match (&d.secrets, &d.base_configs) {
            (Some(_), Some(_)) => {
                self.error(
                    loc,
                    "baseConfigs",
                    "give `secrets` or `baseConfigs`, not both",
                );
                None
            }
            (Some(p), None) => self
                .secret_file(dir, loc, "secrets", p)
                .map(ClusterSecretInput::Bundle),
            (None, Some(b)) => {
                let cp = self.secret_file(dir, loc, "baseConfigs.controlplane", &b.controlplane);
                let w = self.secret_file(dir, loc, "baseConfigs.worker", &b.worker);
                cp.zip(w)
                    .map(|(controlplane, worker)| ClusterSecretInput::BaseConfigs {
                        controlplane,
                        worker,
                    })
            }
            (None, None) => {
                self.error(
                    loc,
                    "",
                    "name the cluster's `secrets` bundle (talosctl gen secrets or plinth cluster init) or its `baseConfigs`, as paths outside the directory",
                );
                None
            }
        };
        let patches = self.patches(dir, loc, "patches", d.patches);
        let cp = self.patches(
            dir,
            loc,
            "rolePatches.controlplane",
            d.role_patches.controlplane,
        );
        let worker = self.patches(dir, loc, "rolePatches.worker", d.role_patches.worker);
        if let Some(p) = &d.etcd_snapshots {
            for (field, msg) in p.problems() {
                self.error(loc, &format!("etcdSnapshots.{field}"), msg);
            }
        }
        let Some(secret) = secret else { return };
        self.out.clusters.push((
            ClusterSpec {
                name: d.name,
                endpoint: d.endpoint,
                talos_version: d.talos_version,
                kubernetes_version: d.kubernetes_version,
                schematic_id,
                schematic_kernel_args,
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
                etcd_snapshots: d.etcd_snapshots,
            },
            secret,
        ));
    }

    fn machine(&mut self, dir: &Path, loc: &DocLocation, body: Value) {
        let Value::Mapping(mut m) = body else { return };
        let patch_refs = m.remove("patches");
        let kernel_args = m.remove("kernelArgs");
        let refs: Vec<PatchRef> = match patch_refs.map(serde_yaml_ng::from_value) {
            None => Vec::new(),
            Some(Ok(r)) => r,
            Some(Err(e)) => return self.error(loc, "patches", e),
        };
        let kernel_args: Vec<String> = match kernel_args.map(serde_yaml_ng::from_value) {
            None => Vec::new(),
            Some(Ok(k)) => k,
            Some(Err(e)) => return self.error(loc, "kernelArgs", e),
        };
        let json = match serde_json::to_value(Value::Mapping(m)) {
            Ok(j) => j,
            Err(e) => return self.error(loc, "", e),
        };
        let Some(spec) = self.typed::<MachineSpec, _>(loc, "Machine", json) else {
            return;
        };
        let Some(host) = spec.hostname.clone() else {
            return self.error(
                loc,
                "hostname",
                "required (it is the machine's key in the directory)",
            );
        };
        self.locate("Machine", &host, loc);
        if spec.bmc.as_ref().is_some_and(|b| b.password.is_some()) {
            return self.error(
                loc,
                "bmc.password",
                "secrets are not kept in the inventory directory; set it with `plinth machine edit --set bmc.password=...`",
            );
        }
        let spec = match spec.validate() {
            Ok(s) => s,
            Err(e) => {
                for f in e.0 {
                    self.error(loc, &f.field, f.message);
                }
                return;
            }
        };
        let patches = self.patches(dir, loc, "patches", refs);
        self.out.machines.push(DeclaredMachine {
            origin: loc.at(""),
            spec,
            patches: MachinePatches {
                patches,
                kernel_args,
            },
        });
    }
}

/// The start line of each YAML document of `text` and the line of each field path in it
/// (`installDisk.size`, `interfaces[0].mac`; the key's line for a mapping entry, the item's for
/// a sequence item). Syntax errors end the walk: serde reports them, with their line.
fn document_lines(text: &str) -> Vec<(usize, std::collections::HashMap<String, usize>)> {
    use saphyr_parser::{Event, Parser};
    enum Frame {
        Map {
            path: String,
            key: Option<(String, usize)>,
        },
        Seq {
            path: String,
            next: usize,
        },
    }
    let join = |parent: &str, key: &str| {
        if parent.is_empty() {
            key.to_string()
        } else {
            format!("{parent}.{key}")
        }
    };
    let mut docs = Vec::new();
    let mut current: Option<(usize, std::collections::HashMap<String, usize>)> = None;
    let mut stack: Vec<Frame> = Vec::new();
    for item in Parser::new_from_str(text) {
        let Ok((event, span)) = item else { break };
        let line = span.start.line();
        match event {
            Event::DocumentStart(_) => {
                current = Some((line, std::collections::HashMap::new()));
                stack.clear();
            }
            Event::DocumentEnd => {
                if let Some(d) = current.take() {
                    docs.push(d);
                }
            }
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
            }
            Event::Scalar(..)
            | Event::Alias(_)
            | Event::MappingStart(..)
            | Event::SequenceStart(..) => {
                // A scalar where a mapping expects its key is that key.
                if let (
                    Some(Frame::Map {
                        key: key @ None, ..
                    }),
                    Event::Scalar(k, ..),
                ) = (stack.last_mut(), &event)
                {
                    *key = Some((k.to_string(), line));
                    continue;
                }
                // Otherwise this node is a value: name it and note its line.
                let (path, at) = match stack.last_mut() {
                    None => (String::new(), line),
                    Some(Frame::Map { path, key }) => {
                        let (k, l) = key.take().unwrap_or_else(|| ("?".into(), line));
                        (join(path.as_str(), &k), l)
                    }
                    Some(Frame::Seq { path, next }) => {
                        *next += 1;
                        (format!("{path}[{}]", *next - 1), line)
                    }
                };
                if let Some((_, lines)) = current.as_mut() {
                    lines.entry(path.clone()).or_insert(at);
                }
                match event {
                    Event::MappingStart(..) => stack.push(Frame::Map { path, key: None }),
                    Event::SequenceStart(..) => stack.push(Frame::Seq { path, next: 0 }),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    if let Some(d) = current.take() {
        docs.push(d);
    }
    docs
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

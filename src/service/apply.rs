//! `plinth apply`: bring the database in line with a declarative inventory directory. First a plan
//! (what is created, changed or left alone, and the diff of every machine's rendered config, secrets
//! redacted), then, unless it is a dry run and only when every affected config renders and
//! validates, the writes: machines through `Inventory` (validation, conflicts, events), then
//! clusters, profiles, groups and machine patches in one transaction.
//!
//! Nothing is deleted: objects in the database that the directory no longer declares are listed.
//! Imports `domain`, `talos` (through `machine_config`), the ports' records and the inventory and
//! config use cases only.

use std::collections::HashMap;

use serde_json::Value;

use super::error::ServiceError;
use super::inventory::Inventory;
use super::machine_config::{config_diff, ClusterSecretInput, ConfigService, Sources};
use super::ports::{
    ClusterSpec, ConfigWrite, GroupSpec, MachineFilter, MachinePatches, NewEvent, ProfileSpec,
};
use crate::domain::{Machine, MachineId, MachineSpec, UniqueKey};

/// Everything a directory declares.
#[derive(Clone, Debug, Default)]
pub struct Declared {
    /// Clusters with their secret input (in memory only).
    pub clusters: Vec<(ClusterSpec, ClusterSecretInput)>,
    /// Profiles.
    pub profiles: Vec<ProfileSpec>,
    /// Sites and racks.
    pub groups: Vec<GroupSpec>,
    /// Machines.
    pub machines: Vec<DeclaredMachine>,
    /// Where each object and inline patch was written, for errors.
    pub locations: Locations,
}

/// Where the objects of a directory were written: errors point at `file:line` of the field.
#[derive(Clone, Debug, Default)]
pub struct Locations {
    /// (kind, name), e.g. ("Profile", "dell-r650"), -> its document.
    pub objects: HashMap<(String, String), DocLocation>,
    /// The origin of an inline patch (`PatchSource::origin`) -> `file:line` of the patch.
    pub patches: HashMap<String, String>,
}

impl Locations {
    /// `file:line` of `field` (a path such as `installDisk.size`) of an object, if it was declared.
    pub fn at(&self, kind: &str, name: &str, field: &str) -> Option<String> {
        self.objects
            .get(&(kind.to_string(), name.to_string()))
            .map(|d| d.at(field))
    }

    /// Where a patch is: its file, or `file:line` of an inline patch.
    pub fn patch(&self, origin: &str) -> String {
        self.patches
            .get(origin)
            .cloned()
            .unwrap_or_else(|| origin.to_string())
    }
}

/// One YAML document: its file (relative to the directory), the line it starts on and the line
/// of each field path in it (`interfaces[0].mac`, `installDisk.size`).
#[derive(Clone, Debug, Default)]
pub struct DocLocation {
    /// File, relative to the inventory directory.
    pub file: String,
    /// Which document of the file (1-based).
    pub index: usize,
    /// Line the document starts on (1-based).
    pub start: usize,
    /// Field path -> line (1-based).
    pub lines: HashMap<String, usize>,
}

impl DocLocation {
    /// The line of `path`, or of its nearest parent that was written, or the document's first.
    pub fn line_of(&self, path: &str) -> usize {
        let mut p = path;
        loop {
            if let Some(l) = self.lines.get(p) {
                return *l;
            }
            // Drop the last segment: `a.b[2].c` -> `a.b[2]` -> `a.b` -> `a` -> ``.
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None if !p.is_empty() => p = "",
                None => return self.start,
            }
        }
    }

    /// `file:line` of `path`.
    pub fn at(&self, path: &str) -> String {
        format!("{}:{}", self.file, self.line_of(path))
    }
}

/// A declared machine.
#[derive(Clone, Debug)]
pub struct DeclaredMachine {
    /// File and document it came from.
    pub origin: String,
    /// Its validated spec (host name set: it is the key).
    pub spec: MachineSpec,
    /// Its own patches and kernel arguments.
    pub patches: MachinePatches,
}

/// What happens to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// New.
    Create,
    /// Changed.
    Update,
    /// Same as in the database.
    Unchanged,
}

impl Action {
    fn of<T: PartialEq>(before: Option<&T>, after: &T) -> Action {
        match before {
            None => Action::Create,
            Some(b) if b == after => Action::Unchanged,
            Some(_) => Action::Update,
        }
    }

    /// `create`, `update`, `unchanged`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Unchanged => "unchanged",
        }
    }
}

/// The plan (and, after a real run, the record) of an apply.
#[derive(Clone, Debug, Default)]
pub struct ApplyReport {
    /// (object, action), e.g. ("Cluster prod", Update).
    pub objects: Vec<(String, Action)>,
    /// (machine, unified diff of its rendered config, secrets redacted).
    pub config_diffs: Vec<(String, String)>,
    /// Why configs do not render or validate after the apply (nothing is written then): one
    /// entry per cause, with every machine it hits.
    pub errors: Vec<ApplyProblem>,
    /// Warnings per machine, and objects the directory no longer declares.
    pub notes: Vec<String>,
    /// Whether the database was written.
    pub applied: bool,
}

/// One cause of configs that do not render, and the machines it hits.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ApplyProblem {
    /// Where the cause is written: `file:line` of the field (or of an inline patch), a patch
    /// file, or `inventory database` for what only the database holds.
    pub at: String,
    /// The field at fault, e.g. `installDisk.size`; empty when `at` says it all.
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// The machines whose config it stops, by name.
    pub machines: Vec<String>,
}

/// Machines a problem names before the rest are left out.
const NAMED_MACHINES: usize = 5;

impl std::fmt::Display for ApplyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ", self.at)?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        write!(f, "{}", self.message)?;
        match self.machines.as_slice() {
            [one] => write!(f, " (machine {one})"),
            all => {
                let shown = all
                    .iter()
                    .take(NAMED_MACHINES)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ");
                let more = if all.len() > NAMED_MACHINES {
                    ", …"
                } else {
                    ""
                };
                write!(f, " ({} machines: {shown}{more})", all.len())
            }
        }
    }
}

/// Where a machine's config error comes from: the declared object and field at fault (or the
/// patch), as (`at`, field, message).
fn blame(
    e: &super::error::MachineConfigError,
    spec: &MachineSpec,
    declared: bool,
    locations: &Locations,
) -> (String, String, String) {
    use super::error::MachineConfigError as E;
    const DATABASE: &str = "inventory database";
    let host = spec.hostname.clone().unwrap_or_default();
    let object = |kind: &str, name: Option<&str>, field: &str| match name {
        Some(n) => locations
            .at(kind, n, field)
            .unwrap_or_else(|| format!("{DATABASE} ({} {n})", kind.to_lowercase())),
        None => DATABASE.to_string(),
    };
    let machine = |field: &str| {
        if declared {
            object("Machine", Some(&host), field)
        } else {
            DATABASE.to_string()
        }
    };
    let cluster = spec.cluster.as_deref();
    match e {
        E::NoCluster => (machine("cluster"), "cluster".into(), e.to_string()),
        E::NoRole => (machine("role"), "role".into(), e.to_string()),
        E::UnknownCluster(_) => (machine("cluster"), "cluster".into(), e.to_string()),
        E::UnknownProfile(_) => (machine("profile"), "profile".into(), e.to_string()),
        E::Cluster {
            cluster: c,
            field,
            message,
        } => (
            object("Cluster", Some(c), field),
            (*field).to_string(),
            message.clone(),
        ),
        E::Secrets(m) => (
            object("Cluster", cluster, "secrets"),
            "secrets".into(),
            m.clone(),
        ),
        E::Disk { rule, message } => {
            let field = match rule {
                Some(r) => format!("installDisk.{r}"),
                None => "installDisk".into(),
            };
            (
                object("Profile", spec.profile.as_deref(), &field),
                field,
                message.clone(),
            )
        }
        E::Patch {
            layer,
            origin,
            message,
        } => (
            locations.patch(origin),
            String::new(),
            format!("patch of layer {layer} does not apply: {message}"),
        ),
        E::Invalid(_) => (object("Cluster", cluster, ""), String::new(), e.to_string()),
        E::Render(_) | E::Store(_) => (machine(""), String::new(), e.to_string()),
    }
}

impl ApplyReport {
    /// Whether anything would change.
    pub fn changes(&self) -> usize {
        self.objects
            .iter()
            .filter(|(_, a)| *a != Action::Unchanged)
            .count()
    }
}

fn machine_name(spec: &MachineSpec, id: Option<MachineId>) -> String {
    spec.hostname
        .clone()
        .or_else(|| id.map(|i| i.to_string()))
        .unwrap_or_else(|| "?".into())
}

/// The merge patch that brings `current` to `declared`: the declared fields (absent ones are left
/// alone), and whether it changes anything.
fn machine_patch(current: &MachineSpec, declared: &MachineSpec) -> (Value, bool) {
    let mut patch = serde_json::to_value(declared).unwrap_or(Value::Null);
    if let Value::Object(o) = &mut patch {
        o.retain(|_, v| !v.is_null() && v != &Value::Array(Vec::new()));
    }
    let mut merged = serde_json::to_value(current).unwrap_or(Value::Null);
    super::inventory::merge_patch(&mut merged, &patch);
    let changed = merged != serde_json::to_value(current).unwrap_or(Value::Null);
    (patch, changed)
}

/// Plan (and unless `dry_run`, apply) a declared inventory.
pub async fn apply(
    configs: &ConfigService,
    inventory: &Inventory,
    declared: Declared,
    dry_run: bool,
    actor: &str,
) -> Result<ApplyReport, ServiceError> {
    let mut report = ApplyReport::default();
    let before = configs.sources().await?;

    // Clusters, profiles, groups: the new sources are the old ones overlaid with the declared.
    let mut write = ConfigWrite::default();
    let mut after = before.clone();
    for (spec, secret) in &declared.clusters {
        let rec = configs.seal_cluster(spec.clone(), secret)?;
        let old = before.clusters.get(&spec.name);
        if let Some(o) = old {
            if let Some(message) = version_step_back(&o.spec, spec) {
                report.errors.push(ApplyProblem {
                    at: declared
                        .locations
                        .at("Cluster", &spec.name, "talosVersion")
                        .unwrap_or_else(|| "inventory".into()),
                    field: "talosVersion".into(),
                    message,
                    machines: Vec::new(),
                });
            }
        }
        let action = match old {
            None => Action::Create,
            Some(o) if o.spec == rec.spec && o.secrets_sha256 == rec.secrets_sha256 => {
                Action::Unchanged
            }
            Some(_) => Action::Update,
        };
        report
            .objects
            .push((format!("Cluster {}", spec.name), action));
        if action != Action::Unchanged {
            after.clusters.insert(spec.name.clone(), rec.clone());
            write.clusters.push(rec);
        }
    }
    for p in &declared.profiles {
        let action = Action::of(before.profiles.get(&p.name), p);
        report.objects.push((format!("Profile {}", p.name), action));
        if action != Action::Unchanged {
            after.profiles.insert(p.name.clone(), p.clone());
            write.profiles.push(p.clone());
        }
    }
    for g in &declared.groups {
        let key = (g.kind, g.name.clone());
        let action = Action::of(before.groups.get(&key), g);
        report
            .objects
            .push((format!("{} {}", kind_title(g), g.name), action));
        if action != Action::Unchanged {
            after.groups.insert(key, g.clone());
            write.groups.push(g.clone());
        }
    }
    note_undeclared(&declared, &before, &mut report);

    // Machines: every machine of the database (its config may change through a shared layer),
    // plus the declared ones.
    let patches: HashMap<MachineId, MachinePatches> =
        configs.all_machine_patches().await?.into_iter().collect();
    let current: Vec<Machine> = inventory
        .all(&MachineFilter {
            limit: 1000,
            ..Default::default()
        })
        .await?;
    let mut by_host: HashMap<String, usize> = HashMap::new();
    for (i, m) in current.iter().enumerate() {
        if let Some(h) = &m.hostname {
            by_host.insert(h.clone(), i);
        }
    }
    struct Planned {
        declared: bool,
        existing: Option<usize>,
        spec_after: MachineSpec,
        patches_after: MachinePatches,
        patch: Option<Value>,
    }
    let mut planned: Vec<Planned> = Vec::new();
    let mut declared_hosts = std::collections::HashSet::new();
    for d in &declared.machines {
        let host = d.spec.hostname.clone().unwrap_or_default();
        declared_hosts.insert(host.clone());
        let existing = by_host.get(&host).copied();
        let (spec_after, patch, action) = match existing {
            None => (d.spec.clone(), None, Action::Create),
            Some(i) => {
                let cur = current[i].spec();
                let (patch, changed) = machine_patch(&cur, &d.spec);
                let old_patches = patches.get(&current[i].id).cloned().unwrap_or_default();
                let mut merged = serde_json::to_value(&cur).unwrap_or(Value::Null);
                super::inventory::merge_patch(&mut merged, &patch);
                let spec_after: MachineSpec = serde_json::from_value(merged).unwrap_or(cur);
                let action = if changed || old_patches != d.patches {
                    Action::Update
                } else {
                    Action::Unchanged
                };
                if let Some(note) = password_note(&host, &current[i], &spec_after) {
                    report.notes.push(note);
                }
                (spec_after, changed.then_some(patch), action)
            }
        };
        report.objects.push((format!("Machine {host}"), action));
        planned.push(Planned {
            declared: true,
            existing,
            spec_after,
            patches_after: d.patches.clone(),
            patch,
        });
    }
    for (i, m) in current.iter().enumerate() {
        if m.hostname
            .as_ref()
            .is_some_and(|h| declared_hosts.contains(h))
        {
            continue;
        }
        planned.push(Planned {
            declared: false,
            existing: Some(i),
            spec_after: m.spec(),
            patches_after: patches.get(&m.id).cloned().unwrap_or_default(),
            patch: None,
        });
    }

    // Render before and after; collect diffs and errors.
    for p in &planned {
        let (id, spec_before, patches_before) = match p.existing {
            Some(i) => (
                Some(current[i].id),
                Some(current[i].spec()),
                patches.get(&current[i].id).cloned().unwrap_or_default(),
            ),
            None => (None, None, MachinePatches::default()),
        };
        let name = machine_name(&p.spec_after, id);
        let in_cluster = |s: &MachineSpec| s.cluster.is_some();
        let old = spec_before
            .as_ref()
            .filter(|s| in_cluster(s))
            .and_then(|s| configs.render_spec(s, &patches_before, &before).ok());
        if !in_cluster(&p.spec_after) {
            continue;
        }
        match configs.render_spec(&p.spec_after, &p.patches_after, &after) {
            Ok(new) => {
                let d = config_diff(
                    old.as_ref().map(|r| r.yaml.as_str()),
                    Some(&new.yaml),
                    &name,
                );
                if !d.is_empty() {
                    for w in &new.warnings {
                        report.notes.push(format!("Machine {name}: {w}"));
                    }
                    report.config_diffs.push((name, d));
                }
            }
            Err(e) => {
                // One entry per cause, however many machines it stops.
                let (at, field, message) =
                    blame(&e, &p.spec_after, p.declared, &declared.locations);
                match report
                    .errors
                    .iter_mut()
                    .find(|x| x.at == at && x.field == field && x.message == message)
                {
                    Some(x) => x.machines.push(name),
                    None => report.errors.push(ApplyProblem {
                        at,
                        field,
                        message,
                        machines: vec![name],
                    }),
                }
            }
        }
    }
    if dry_run || !report.errors.is_empty() {
        return Ok(report);
    }

    // Write: machines first (their ids key the patches), then everything else in one transaction.
    for (p, d) in planned.iter().zip(declared.machines.iter()) {
        let id = match p.existing {
            None => inventory.create(d.spec.clone(), actor).await?.id,
            Some(i) => {
                let m = &current[i];
                if let Some(patch) = &p.patch {
                    inventory
                        .update(m.id, Some(m.version), patch.clone(), actor)
                        .await?;
                }
                m.id
            }
        };
        if p.existing.is_none() || patches.get(&id) != Some(&d.patches) {
            write.machine_patches.push((id, d.patches.clone()));
        }
    }
    let event = NewEvent {
        machine_id: None,
        kind: "inventory.applied".into(),
        actor: actor.into(),
        detail: serde_json::json!({
            "changes": report.objects.iter().filter(|(_, a)| *a != Action::Unchanged)
                .map(|(o, a)| format!("{} {o}", a.as_str())).collect::<Vec<_>>(),
        }),
    };
    configs.put_config_objects(&write, &[event]).await?;
    report.applied = true;
    Ok(report)
}

/// A declared `talosVersion` older than the one the database holds (a rolling upgrade moves the
/// stored one forward): applying it would make later installs older than the nodes run.
fn version_step_back(stored: &ClusterSpec, declared: &ClusterSpec) -> Option<String> {
    let parse = |v: &str| v.parse::<crate::talos::TalosVersion>().ok();
    let (now, then) = (
        parse(&stored.talos_version)?,
        parse(&declared.talos_version)?,
    );
    (then < now).then(|| {
        format!(
            "Cluster {}: talosVersion {} is older than {}, which the database holds (a rolling \
             upgrade moved it there, or an earlier apply declared it): later installs would run an \
             older Talos than the nodes; declare talosVersion: {} (and the schematic or installImage \
             the upgrade left, see `plinth cluster upgrade {} --status`)",
            declared.name,
            declared.talos_version,
            stored.talos_version,
            stored.talos_version,
            declared.name
        )
    })
}

/// A declared machine whose BMC moves to another origin loses its stored password (the directory
/// never carries one): say so in the plan.
fn password_note(host: &str, current: &Machine, after: &MachineSpec) -> Option<String> {
    let before = current.bmc.as_ref().filter(|b| b.has_password)?;
    let after = after.bmc.as_ref()?;
    let origin = |u: &str| crate::domain::bmc_origin(u).unwrap_or_else(|_| u.to_string());
    let (from, to) = (origin(&before.url), origin(&after.url));
    (from != to).then(|| {
        format!(
            "Machine {host}: bmc.url moves from {from} to {to}: its stored BMC password is \
             discarded; set it again with `plinth machine edit {host} --set bmc.password=...`"
        )
    })
}

fn kind_title(g: &GroupSpec) -> &'static str {
    match g.kind {
        crate::service::ports::GroupKind::Site => "Site",
        crate::service::ports::GroupKind::Rack => "Rack",
    }
}

fn note_undeclared(declared: &Declared, before: &Sources, report: &mut ApplyReport) {
    for name in before.clusters.keys() {
        if !declared.clusters.iter().any(|(c, _)| &c.name == name) {
            report.notes.push(format!(
                "Cluster {name} is in the database but not in the directory (left as it is)"
            ));
        }
    }
    for name in before.profiles.keys() {
        if !declared.profiles.iter().any(|p| &p.name == name) {
            report.notes.push(format!(
                "Profile {name} is in the database but not in the directory (left as it is)"
            ));
        }
    }
}

/// Find a machine by a reference the CLI takes (id, host name, MAC, serial, asset tag, UUID).
pub async fn resolve(inventory: &Inventory, reference: &str) -> Result<Machine, ServiceError> {
    if let Ok(mac) = reference.parse::<crate::domain::MacAddr>() {
        return inventory.lookup(&UniqueKey::Mac(mac)).await;
    }
    inventory.resolve(reference).await
}

//! Rendering a machine's config: the base config of its role, then patch layers in order
//! (cluster, role, groups such as site or rack, machine), then the machine's own facts (hostname,
//! install disk, installer image, boot NIC by MAC), written in the shape the target Talos version
//! takes: `machine.install` up to 1.13, the `UnattendedInstallConfig` document from 1.14.
//!
//! [`render`] is a pure function of its inputs: the caller loads the base config and patches,
//! decides the install disk with [`crate::talos::disk::plan_install_disk`], and validates the
//! result with [`crate::talos::validate`]. Imports nothing outside `crate::talos` and
//! `crate::domain`.

use serde_yaml_ng::{Mapping, Value};

use super::disk::{InstallDiskPlan, InstallSelector};
use super::patch::{Patch, PatchError};
use super::schematic::{installer_image, SchematicId};
use super::{DocumentId, MachineConfig, TalosVersion};
use crate::domain::MacAddr;

/// Why a config could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A patch of a layer failed.
    #[error("patch layer `{layer}`, patch {index}: {source}")]
    Patch {
        /// Layer name, e.g. `cluster`, `role:worker`, `rack:r12`, `machine`.
        layer: String,
        /// 0-based patch index in the layer.
        index: usize,
        /// The failure.
        source: PatchError,
    },
    /// The config has no v1alpha1 document to carry the machine's facts.
    #[error("the rendered config has no v1alpha1 document")]
    NoV1alpha1,
    /// A fact does not fit the config.
    #[error("{path}: {reason}")]
    Fact {
        /// YAML path.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// A named list of patches applied together.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// Name for error messages: `cluster`, `role:controlplane`, `site:fra1`, `machine`.
    pub name: String,
    /// Patches, applied in order.
    pub patches: Vec<Patch>,
}

/// Where the installer image comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Installer {
    /// Image Factory: `<host>/metal-installer/<schematic>:<version>` (or `installer` before
    /// Talos 1.10).
    Factory {
        /// Factory host, e.g. `factory.talos.dev`.
        host: String,
        /// Schematic id.
        schematic: SchematicId,
    },
    /// A full image reference.
    Image(String),
}

impl Installer {
    /// The image reference for `version`.
    pub fn image(&self, version: TalosVersion) -> String {
        match self {
            Installer::Factory { host, schematic } => installer_image(host, schematic, version),
            Installer::Image(i) => i.clone(),
        }
    }
}

/// What Plinth knows about the machine, written last over all layers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineFacts {
    /// Host name (already validated).
    pub hostname: Option<String>,
    /// The install disk decided for this machine and version.
    pub install_disk: Option<InstallDiskPlan>,
    /// Installer image.
    pub installer: Option<Installer>,
    /// MAC of the boot NIC; configured with DHCP unless a layer configures it already.
    pub boot_mac: Option<MacAddr>,
    /// Whether to wipe the install disk.
    pub wipe: Option<bool>,
}

/// Everything a render needs.
#[derive(Clone, Copy, Debug)]
pub struct RenderInput<'a> {
    /// Target Talos version.
    pub version: TalosVersion,
    /// Base config of the machine's role.
    pub base: &'a MachineConfig,
    /// Patch layers, in order.
    pub layers: &'a [Layer],
    /// The machine's facts.
    pub facts: &'a MachineFacts,
}

/// A rendered config and what the operator should know about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    /// The config.
    pub config: MachineConfig,
    /// Warnings (e.g. install-disk uniqueness unchecked).
    pub warnings: Vec<String>,
}

/// Render a machine's config.
pub fn render(input: &RenderInput<'_>) -> Result<Rendered, RenderError> {
    let mut cfg = input.base.clone();
    for layer in input.layers {
        for (index, p) in layer.patches.iter().enumerate() {
            p.apply_to(&mut cfg).map_err(|source| RenderError::Patch {
                layer: layer.name.clone(),
                index,
                source,
            })?;
        }
    }
    let facts = input.facts;
    let mut warnings = Vec::new();
    if let Some(h) = &facts.hostname {
        set_hostname(&mut cfg, h, input.version)?;
    }
    if let Some(mac) = facts.boot_mac {
        set_boot_nic(&mut cfg, mac, input.version)?;
    }
    if let Some(plan) = &facts.install_disk {
        warnings.extend(plan.warnings.iter().cloned());
    }
    let image = facts.installer.as_ref().map(|i| i.image(input.version));
    if input.version.uses_unattended_install() {
        set_unattended_install(&mut cfg, facts, image)?;
    } else {
        set_machine_install(&mut cfg, facts, image)?;
    }
    Ok(Rendered {
        config: cfg,
        warnings,
    })
}

/// The mapping at `path` under `root`, created (or a null replaced) as needed.
fn mapping_at<'a>(root: &'a mut Value, path: &[&str]) -> Result<&'a mut Mapping, RenderError> {
    let mut node = root;
    for (i, k) in path.iter().enumerate() {
        if node.is_null() {
            *node = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(m) = node else {
            return Err(RenderError::Fact {
                path: path[..i].join("."),
                reason: format!("expected a mapping, found {}", super::kind_name(node)),
            });
        };
        node = m
            .entry(Value::String((*k).to_string()))
            .or_insert(Value::Null);
    }
    if node.is_null() {
        *node = Value::Mapping(Mapping::new());
    }
    match node {
        Value::Mapping(m) => Ok(m),
        other => Err(RenderError::Fact {
            path: path.join("."),
            reason: format!("expected a mapping, found {}", super::kind_name(other)),
        }),
    }
}

fn v1alpha1(cfg: &mut MachineConfig) -> Result<&mut Value, RenderError> {
    cfg.v1alpha1_mut().ok_or(RenderError::NoV1alpha1)
}

/// Talos 1.12 moved network settings to their own documents and deprecated
/// `machine.network`; 1.13 hides it from the schema.
fn uses_network_documents(version: TalosVersion) -> bool {
    version >= TalosVersion::new(1, 12, 0)
}

fn doc(api_version: &str, kind: &str, fields: &[(&str, Value)]) -> Value {
    let mut m = Mapping::new();
    m.insert("apiVersion".into(), api_version.into());
    m.insert("kind".into(), kind.into());
    for (k, v) in fields {
        m.insert((*k).into(), v.clone());
    }
    Value::Mapping(m)
}

fn ids_of_kind(cfg: &MachineConfig, kind: &str) -> Vec<DocumentId> {
    cfg.documents()
        .iter()
        .filter_map(DocumentId::of)
        .filter(|id| id.kind == kind)
        .collect()
}

/// The hostname goes where the config already keeps it (a `HostnameConfig` document, or
/// `machine.network.hostname`); otherwise into a new `HostnameConfig` from Talos 1.12 on, or
/// `machine.network.hostname` before.
fn set_hostname(
    cfg: &mut MachineConfig,
    hostname: &str,
    version: TalosVersion,
) -> Result<(), RenderError> {
    let name = Value::String(hostname.to_string());
    if let Some(id) = ids_of_kind(cfg, "HostnameConfig").into_iter().next() {
        if let Some(Value::Mapping(m)) = cfg.document_mut(&id) {
            m.remove("auto");
            m.insert("hostname".into(), name);
            drop_stable_hostname(cfg);
            return Ok(());
        }
    }
    let legacy = cfg
        .v1alpha1()
        .and_then(|d| d.get("machine"))
        .and_then(|m| m.get("network"))
        .and_then(|n| n.get("hostname"))
        .is_some_and(|h| !h.is_null());
    if uses_network_documents(version) && !legacy {
        cfg.documents_mut()
            .push(doc("v1alpha1", "HostnameConfig", &[("hostname", name)]));
        drop_stable_hostname(cfg);
        return Ok(());
    }
    mapping_at(v1alpha1(cfg)?, &["machine", "network"])?.insert("hostname".into(), name);
    Ok(())
}

/// Talos refuses a `HostnameConfig` next to `machine.features.stableHostname: true` ("stable
/// hostname is already set in v1alpha1 config"); a static hostname supersedes it anyway.
fn drop_stable_hostname(cfg: &mut MachineConfig) {
    if let Some(Value::Mapping(f)) = cfg
        .v1alpha1_mut()
        .and_then(|d| d.get_mut("machine"))
        .and_then(|m| m.get_mut("features"))
    {
        f.remove("stableHostname");
    }
}

/// The boot NIC gets DHCP unless a layer configures it already. Configs that use the legacy
/// `machine.network.interfaces` list (and all configs before Talos 1.12) get a list entry
/// selecting the NIC by MAC; others get a `LinkAliasConfig` selecting it by permanent MAC and a
/// `DHCPv4Config` for that alias.
fn set_boot_nic(
    cfg: &mut MachineConfig,
    mac: MacAddr,
    version: TalosVersion,
) -> Result<(), RenderError> {
    let mac = mac.to_string().to_ascii_lowercase();
    let legacy_list = cfg
        .v1alpha1()
        .and_then(|d| d.get("machine"))
        .and_then(|m| m.get("network"))
        .and_then(|n| n.get("interfaces"))
        .and_then(Value::as_sequence)
        .is_some_and(|l| !l.is_empty());
    if uses_network_documents(version) && !legacy_list {
        let aliased = cfg.documents().iter().any(|d| {
            DocumentId::of(d).is_some_and(|id| id.kind == "LinkAliasConfig")
                && d.get("selector")
                    .and_then(|s| s.get("match"))
                    .and_then(Value::as_str)
                    .is_some_and(|m| m.to_ascii_lowercase().contains(&mac))
        });
        if aliased {
            return Ok(());
        }
        let taken: Vec<String> = cfg
            .documents()
            .iter()
            .filter_map(|d| d.get("name").and_then(Value::as_str).map(str::to_string))
            .collect();
        let alias = (0..)
            .map(|i| format!("boot{i}"))
            .find(|n| !taken.contains(n))
            .unwrap_or_else(|| "boot".into());
        let mut selector = Mapping::new();
        selector.insert(
            "match".into(),
            Value::String(format!("mac(link.permanent_addr) == \"{mac}\"")),
        );
        cfg.documents_mut().push(doc(
            "v1alpha1",
            "LinkAliasConfig",
            &[
                ("name", Value::String(alias.clone())),
                ("selector", Value::Mapping(selector)),
            ],
        ));
        cfg.documents_mut().push(doc(
            "v1alpha1",
            "DHCPv4Config",
            &[("name", Value::String(alias))],
        ));
        return Ok(());
    }
    let net = mapping_at(v1alpha1(cfg)?, &["machine", "network"])?;
    let ifaces = net
        .entry("interfaces".into())
        .or_insert(Value::Sequence(Vec::new()));
    if ifaces.is_null() {
        *ifaces = Value::Sequence(Vec::new());
    }
    let Value::Sequence(list) = ifaces else {
        return Err(RenderError::Fact {
            path: "machine.network.interfaces".into(),
            reason: "expected a list".into(),
        });
    };
    let configured = list.iter().any(|i| {
        i.get("deviceSelector")
            .and_then(|s| s.get("hardwareAddr"))
            .and_then(Value::as_str)
            .is_some_and(|a| a.eq_ignore_ascii_case(&mac))
    });
    if !configured {
        let mut sel = Mapping::new();
        sel.insert("hardwareAddr".into(), Value::String(mac));
        let mut item = Mapping::new();
        item.insert("deviceSelector".into(), Value::Mapping(sel));
        item.insert("dhcp".into(), Value::Bool(true));
        list.push(Value::Mapping(item));
    }
    Ok(())
}

fn set_machine_install(
    cfg: &mut MachineConfig,
    facts: &MachineFacts,
    image: Option<String>,
) -> Result<(), RenderError> {
    if facts.install_disk.is_none() && image.is_none() && facts.wipe.is_none() {
        return Ok(());
    }
    let install = mapping_at(v1alpha1(cfg)?, &["machine", "install"])?;
    if let Some(plan) = &facts.install_disk {
        match &plan.selector {
            InstallSelector::DiskSelector(sel) => {
                // The selector pins the disk; a kernel name left over from the base config
                // would only mislead a reader.
                install.remove("disk");
                install.insert("diskSelector".into(), Value::Mapping(sel.clone()));
            }
            InstallSelector::Cel(_) => {
                return Err(RenderError::Fact {
                    path: "machine.install.diskSelector".into(),
                    reason: "the install disk was planned as a CEL expression (Talos 1.14+) but the target version uses machine.install".into(),
                })
            }
        }
    }
    if let Some(i) = image {
        install.insert("image".into(), Value::String(i));
    }
    if let Some(w) = facts.wipe {
        install.insert("wipe".into(), Value::Bool(w));
    }
    Ok(())
}

fn set_unattended_install(
    cfg: &mut MachineConfig,
    facts: &MachineFacts,
    image: Option<String>,
) -> Result<(), RenderError> {
    // The legacy section goes: Talos 1.14 takes the document, and both together conflict. Its
    // image and wipe carry over unless the facts say otherwise.
    let legacy = match v1alpha1(cfg)?.get_mut("machine") {
        Some(Value::Mapping(m)) => m.remove("install"),
        _ => None,
    };
    let legacy_image = legacy
        .as_ref()
        .and_then(|l| l.get("image"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let legacy_wipe = legacy
        .as_ref()
        .and_then(|l| l.get("wipe"))
        .and_then(Value::as_bool);
    let id = DocumentId {
        api_version: "v1alpha1".into(),
        kind: "UnattendedInstallConfig".into(),
        name: None,
    };
    if cfg.document(&id).is_none() {
        if facts.install_disk.is_none() && image.is_none() && legacy_image.is_none() {
            return Ok(());
        }
        cfg.documents_mut()
            .push(doc("v1alpha1", "UnattendedInstallConfig", &[]));
    }
    let doc = cfg.document_mut(&id).ok_or(RenderError::Fact {
        path: "(document UnattendedInstallConfig)".into(),
        reason: "missing after insertion".into(),
    })?;
    if let Some(i) = image.or(legacy_image) {
        mapping_at(doc, &["installer"])?.insert("image".into(), Value::String(i));
    }
    if let Some(plan) = &facts.install_disk {
        match &plan.selector {
            InstallSelector::Cel(expr) => {
                mapping_at(doc, &["provisioning", "diskSelector"])?
                    .insert("match".into(), Value::String(expr.clone()));
            }
            InstallSelector::DiskSelector(_) => {
                return Err(RenderError::Fact {
                    path: "(document UnattendedInstallConfig) provisioning.diskSelector".into(),
                    reason: "the install disk was planned as a machine.install diskSelector (Talos <= 1.13) but the target version takes a CEL expression".into(),
                })
            }
        }
    }
    if let Some(w) = facts.wipe.or(legacy_wipe) {
        mapping_at(doc, &["provisioning"])?.insert("wipe".into(), Value::Bool(w));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Disk, DiskType};
    use crate::talos::disk::{plan_install_disk, DiskRules};
    use crate::talos::patch::load_patch;
    use crate::talos::schematic::VANILLA_SCHEMATIC;

    const BASE: &str = "version: v1alpha1\nmachine:\n  type: worker\n  install: {disk: /dev/sda, image: ghcr.io/siderolabs/installer:v1.11.6, wipe: false}\n  network: {}\ncluster:\n  controlPlane: {endpoint: 'https://10.0.0.1:6443'}\n";

    fn layer(name: &str, patches: &[&str]) -> Layer {
        Layer {
            name: name.into(),
            patches: patches
                .iter()
                .map(|p| load_patch(p).expect("patch"))
                .collect(),
        }
    }

    fn facts(version: TalosVersion) -> MachineFacts {
        let disks = vec![Disk {
            serial: Some("S3Z9NB0K".into()),
            size_bytes: Some(480_000_000_000),
            disk_type: Some(DiskType::Ssd),
            ..Default::default()
        }];
        let rules: DiskRules = serde_yaml_ng::from_str("type: ssd").expect("rules");
        MachineFacts {
            hostname: Some("node-01".into()),
            install_disk: Some(plan_install_disk(&rules, &disks, version).expect("plan")),
            installer: Some(Installer::Factory {
                host: "factory.talos.dev".into(),
                schematic: SchematicId::parse(VANILLA_SCHEMATIC).expect("id"),
            }),
            boot_mac: Some("52:54:00:AA:BB:CC".parse().expect("mac")),
            wipe: None,
        }
    }

    fn yaml(t: &str) -> Value {
        serde_yaml_ng::from_str(t).expect("yaml")
    }

    #[test]
    fn layers_apply_in_order_and_facts_come_last() {
        let base = MachineConfig::parse(BASE).expect("base");
        let layers = [
            layer(
                "cluster",
                &["machine: {network: {hostname: from-cluster, nameservers: [1.1.1.1]}}"],
            ),
            layer(
                "role:worker",
                &["machine: {network: {nameservers: [9.9.9.9]}}"],
            ),
            layer(
                "machine",
                &["[{op: add, path: /machine/network/hostname, value: from-machine}]"],
            ),
        ];
        let v = TalosVersion::new(1, 11, 6);
        let f = facts(v);
        let out = render(&RenderInput {
            version: v,
            base: &base,
            layers: &layers,
            facts: &f,
        })
        .expect("render");
        let doc = &out.config.documents()[0];
        assert_eq!(
            doc["machine"]["network"],
            yaml("{hostname: node-01, nameservers: [1.1.1.1, 9.9.9.9], interfaces: [{deviceSelector: {hardwareAddr: '52:54:00:aa:bb:cc'}, dhcp: true}]}")
        );
        assert_eq!(
            doc["machine"]["install"],
            yaml(&format!("{{image: 'factory.talos.dev/metal-installer/{VANILLA_SCHEMATIC}:v1.11.6', wipe: false, diskSelector: {{serial: S3Z9NB0K}}}}"))
        );
        assert!(out.warnings.is_empty());
    }

    #[test]
    fn talos_114_gets_an_unattended_install_document() {
        let base = MachineConfig::parse(BASE).expect("base");
        let v = TalosVersion::new(1, 14, 0);
        let f = facts(v);
        let out = render(&RenderInput {
            version: v,
            base: &base,
            layers: &[],
            facts: &f,
        })
        .expect("render");
        let docs = out.config.documents();
        assert!(docs[0]["machine"].get("install").is_none());
        let kinds: Vec<&str> = docs[1..]
            .iter()
            .filter_map(|d| d["kind"].as_str())
            .collect();
        assert_eq!(
            kinds,
            [
                "HostnameConfig",
                "LinkAliasConfig",
                "DHCPv4Config",
                "UnattendedInstallConfig"
            ]
        );
        assert_eq!(
            docs[1],
            yaml("{apiVersion: v1alpha1, kind: HostnameConfig, hostname: node-01}")
        );
        assert_eq!(
            docs[2],
            yaml("{apiVersion: v1alpha1, kind: LinkAliasConfig, name: boot0, selector: {match: 'mac(link.permanent_addr) == \"52:54:00:aa:bb:cc\"'}}")
        );
        assert_eq!(
            docs[3],
            yaml("{apiVersion: v1alpha1, kind: DHCPv4Config, name: boot0}")
        );
        assert_eq!(
            docs[4],
            yaml(&format!("apiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller: {{image: 'factory.talos.dev/metal-installer/{VANILLA_SCHEMATIC}:v1.14.0'}}\nprovisioning:\n  diskSelector: {{match: 'disk.serial == \"S3Z9NB0K\" && disk.transport != \"\" && disk.transport != \"usb\" && !disk.readonly && !disk.cdrom'}}\n  wipe: false\n"))
        );
    }

    #[test]
    fn a_configured_boot_nic_is_left_alone_and_errors_name_the_layer() {
        let base = MachineConfig::parse(BASE).expect("base");
        let layers = [layer(
            "machine",
            &["machine: {network: {interfaces: [{deviceSelector: {hardwareAddr: '52:54:00:aa:bb:cc'}, addresses: [10.0.0.7/24]}]}}"],
        )];
        let v = TalosVersion::new(1, 12, 0);
        let f = facts(v);
        let out = render(&RenderInput {
            version: v,
            base: &base,
            layers: &layers,
            facts: &f,
        })
        .expect("render");
        let ifaces = &out.config.documents()[0]["machine"]["network"]["interfaces"];
        assert_eq!(ifaces.as_sequence().map(Vec::len), Some(1));
        assert!(ifaces[0].get("dhcp").is_none());

        let bad = [layer("rack:r1", &["machine: {network: []}"])];
        let e = render(&RenderInput {
            version: v,
            base: &base,
            layers: &bad,
            facts: &f,
        })
        .expect_err("mismatch");
        assert!(
            e.to_string().starts_with("patch layer `rack:r1`, patch 0:"),
            "{e}"
        );
    }

    #[test]
    fn a_static_hostname_document_replaces_stable_hostname() {
        let base = MachineConfig::parse(&BASE.replace(
            "  network: {}\n",
            "  network: {}\n  features: {stableHostname: true, rbac: true}\n",
        ))
        .expect("base");
        let v = TalosVersion::new(1, 12, 0);
        let f = MachineFacts {
            hostname: Some("node-01".into()),
            ..Default::default()
        };
        let out = render(&RenderInput {
            version: v,
            base: &base,
            layers: &[],
            facts: &f,
        })
        .expect("render");
        let docs = out.config.documents();
        assert_eq!(docs[0]["machine"]["features"], yaml("{rbac: true}"));
        assert_eq!(
            docs[1],
            yaml("{apiVersion: v1alpha1, kind: HostnameConfig, hostname: node-01}")
        );
        assert!(crate::talos::validate::check_semantics(&out.config, v)
            .iter()
            .all(|v| !v.path.contains("ostname")));
    }

    #[test]
    fn plans_for_the_wrong_version_are_refused() {
        let base = MachineConfig::parse(BASE).expect("base");
        let f = facts(TalosVersion::new(1, 14, 0));
        let e = render(&RenderInput {
            version: TalosVersion::new(1, 13, 0),
            base: &base,
            layers: &[],
            facts: &f,
        })
        .expect_err("cel for 1.13");
        assert!(e.to_string().contains("CEL"), "{e}");
    }
}

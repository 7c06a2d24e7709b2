//! Talos config patches: strategic merge patches (with `$patch: delete`) and RFC 6902 JSON
//! patches, applied to a multi-document [`MachineConfig`] the way `talosctl machineconfig patch`
//! applies them.
//!
//! Talos merges typed Go structs; Plinth merges YAML data, so the typed rules are written down
//! here once, as a table ([`RULES`]) keyed by document kind and YAML path:
//! - mappings merge key by key; a patch value of `null`, `""` or `0` leaves the base untouched
//!   (Talos skips zero values), while `false` always applies;
//! - lists append, except the fields Talos tags `merge:"replace"` (e.g.
//!   `cluster.network.podSubnets`, `cluster.network.serviceSubnets`,
//!   `cluster.apiServer.auditPolicy`), which are replaced wholesale;
//! - `machine.network.interfaces` entries merge by `interface`, else by `deviceSelector`; their
//!   `vlans` by `vlanId`; `cluster.apiServer.admissionControl` by `name`;
//!   `ExtensionServiceConfig.configFiles` by `mountPath`;
//! - `extraArgs` maps replace per key;
//! - `$patch: delete` removes a key, a list item (matched by the first other key of the item) or a
//!   whole non-v1alpha1 document. Within one patch document the deletes run before the merge.
//!
//! Documents are matched by [`DocumentId`]; a patch document that matches nothing is appended.
//! JSON patches are refused on multi-document configs, as Talos does. This module performs no I/O
//! except [`load_patch_file`], and imports nothing outside `crate::talos`.
//!
//! Parts: [`rules`] owns the table of typed merge rules; [`strategic`] owns strategic merge
//! patches and `$patch: delete`; [`json6902`] owns RFC 6902 JSON patches and JSON pointers. This
//! file owns the patch error, loading a patch from text or a file, and applying patches in order.

use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;

use super::{parse_documents, ConfigError, MachineConfig};

pub mod json6902;
pub mod rules;
pub mod strategic;

pub use json6902::{JsonOp, JsonPatch, Pointer};
pub use rules::{rule_for, MergeRule, RULES};
pub use strategic::StrategicPatch;

/// Why a patch could not be read or applied. Every variant names the YAML path it is about.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch file could not be read.
    #[error("cannot read patch {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The patch text is not a config-shaped YAML.
    #[error("patch: {0}")]
    Parse(#[from] ConfigError),
    /// The text is neither a strategic merge patch nor a JSON patch.
    #[error("not a patch: {0}")]
    NotAPatch(String),
    /// A JSON patch operation is malformed.
    #[error("JSON patch operation {index}: {reason}")]
    BadOperation {
        /// 0-based operation index.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A JSON patch was given for a config of several documents.
    #[error("JSON6902 patches are not supported for multi-document machine configuration ({0} documents); use a strategic merge patch")]
    JsonPatchMultiDocument(usize),
    /// A JSON patch operation failed against the config.
    #[error("JSON patch operation {index} ({op} {path}): {reason}")]
    JsonPatchFailed {
        /// 0-based operation index.
        index: usize,
        /// The operation name.
        op: &'static str,
        /// The YAML path of the operation.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A `$patch` directive other than `delete`, or one in a place Talos does not allow.
    #[error("patch document {document}: {path}: {reason}")]
    BadDirective {
        /// 0-based patch document index.
        document: usize,
        /// Where the directive is.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A `$patch: delete` found nothing to delete.
    #[error("patch delete: path '{path}' in document {doc}: {reason}")]
    DeleteFailed {
        /// The document the delete targets.
        doc: String,
        /// The YAML path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The patch and the config disagree on the shape of a value.
    #[error("cannot merge {right} into {left} at {path} in document {doc}")]
    TypeMismatch {
        /// The document.
        doc: String,
        /// The YAML path.
        path: String,
        /// What the config holds.
        left: &'static str,
        /// What the patch holds.
        right: &'static str,
    },
}

/// A patch, as `talosctl --patch` takes it.
#[derive(Clone, Debug, PartialEq)]
pub enum Patch {
    /// A strategic merge patch (one or more documents).
    Strategic(StrategicPatch),
    /// An RFC 6902 JSON patch.
    Json(JsonPatch),
}

impl Patch {
    /// Apply this patch to a config in place. On error the config may be partly patched: apply
    /// to a copy (as [`apply`] does) when that matters.
    pub fn apply_to(&self, config: &mut MachineConfig) -> Result<(), PatchError> {
        match self {
            Patch::Strategic(p) => p.apply_to(config),
            Patch::Json(p) => p.apply_to(config),
        }
    }
}

/// The keys of a YAML path (`machine.network.interfaces[0].mtu` ->
/// `["machine", "network", "interfaces", "mtu"]`; list indices dropped).
pub(crate) fn path_keys(path: &str) -> Vec<String> {
    path.split('.')
        .map(|k| k.split('[').next().unwrap_or(k).to_string())
        .filter(|k| !k.is_empty())
        .collect()
}

/// Whether one key path lies on the other (one is a prefix of the other).
pub(crate) fn on_path(a: &[String], b: &[String]) -> bool {
    a.iter().zip(b).all(|(x, y)| x == y)
}

impl Patch {
    /// Whether this patch sets, merges or deletes something at `path` (or above or below it) in
    /// the document `document` (as [`DocumentId`](super::DocumentId) displays it): used to name
    /// the layer that set a field a rule refuses.
    pub fn touches(&self, document: &str, path: &str) -> bool {
        let keys = path_keys(path);
        match self {
            Patch::Strategic(p) => p.touches(document, &keys),
            Patch::Json(p) => document == "v1alpha1" && p.touches(&keys),
        }
    }
}

/// Read a patch from text: a YAML or JSON list of operations is a JSON patch; one or more YAML
/// mappings are a strategic merge patch.
pub fn load_patch(text: &str) -> Result<Patch, PatchError> {
    let docs = parse_documents(text)?;
    match docs.as_slice() {
        [] => Err(PatchError::NotAPatch("the patch is empty".into())),
        [Value::Sequence(ops)] => Ok(Patch::Json(JsonPatch::from_operations(ops)?)),
        _ if docs.iter().all(Value::is_mapping) => {
            Ok(Patch::Strategic(StrategicPatch::from_documents(docs)?))
        }
        _ => Err(PatchError::NotAPatch(
            "expected a list of JSON patch operations or one or more config documents".into(),
        )),
    }
}

/// Read a patch from a file (see [`load_patch`]).
pub fn load_patch_file(path: &Path) -> Result<Patch, PatchError> {
    let text = std::fs::read_to_string(path).map_err(|source| PatchError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    load_patch(&text)
}

/// Apply patches in order to a copy of `config`.
pub fn apply(config: &MachineConfig, patches: &[Patch]) -> Result<MachineConfig, PatchError> {
    let mut out = config.clone();
    for p in patches {
        p.apply_to(&mut out)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> MachineConfig {
        MachineConfig::parse(text).expect("config")
    }

    fn patched(base: &str, patches: &[&str]) -> Result<MachineConfig, PatchError> {
        let ps: Vec<Patch> = patches
            .iter()
            .map(|p| load_patch(p).expect("patch"))
            .collect();
        apply(&cfg(base), &ps)
    }

    fn yaml(text: &str) -> Value {
        serde_yaml_ng::from_str(text).expect("yaml")
    }

    #[test]
    fn merge_rules_table() {
        // (base, patch, path to check, expected value at that path)
        let cases: &[(&str, &str, &[&str], &str)] = &[
            // maps merge, scalars override
            (
                "machine: {network: {hostname: a}, type: worker}",
                "machine: {network: {hostname: b}}",
                &["machine"],
                "{network: {hostname: b}, type: worker}",
            ),
            // zero scalars do not override; false does
            (
                "machine: {type: worker, kubelet: {x: 5}, features: {rbac: true}}",
                "machine: {type: '', kubelet: {x: 0}, features: {rbac: false}}",
                &["machine"],
                "{type: worker, kubelet: {x: 5}, features: {rbac: false}}",
            ),
            // most lists append (certSANs, nameservers are not replace fields in Talos)
            (
                "machine: {certSANs: [a], network: {nameservers: [1.1.1.1]}}",
                "machine: {certSANs: [b], network: {nameservers: [8.8.8.8]}}",
                &["machine"],
                "{certSANs: [a, b], network: {nameservers: [1.1.1.1, 8.8.8.8]}}",
            ),
            // merge:"replace" lists
            (
                "cluster: {network: {podSubnets: [10.244.0.0/16], serviceSubnets: [10.96.0.0/12]}}",
                "cluster: {network: {podSubnets: [192.168.0.0/16], serviceSubnets: [10.0.0.0/12]}}",
                &["cluster", "network"],
                "{podSubnets: [192.168.0.0/16], serviceSubnets: [10.0.0.0/12]}",
            ),
            // auditPolicy replaced
            (
                "cluster: {apiServer: {auditPolicy: {kind: Policy, rules: [{level: Metadata}]}}}",
                "cluster: {apiServer: {auditPolicy: {kind: Policy, rules: [{level: None}]}}}",
                &["cluster", "apiServer", "auditPolicy"],
                "{kind: Policy, rules: [{level: None}]}",
            ),
            // interfaces merge by interface name, then by deviceSelector
            (
                "machine: {network: {interfaces: [{interface: eth0, addresses: [10.0.0.2/24]}, {deviceSelector: {hardwareAddr: 'aa:bb:cc:dd:ee:ff'}, mtu: 1500}]}}",
                "machine: {network: {interfaces: [{interface: eth0, addresses: [10.0.0.3/24]}, {deviceSelector: {hardwareAddr: 'aa:bb:cc:dd:ee:ff'}, mtu: 9000}, {interface: eth1, dhcp: true}]}}",
                &["machine", "network", "interfaces"],
                "[{interface: eth0, addresses: [10.0.0.2/24, 10.0.0.3/24]}, {deviceSelector: {hardwareAddr: 'aa:bb:cc:dd:ee:ff'}, mtu: 9000}, {interface: eth1, dhcp: true}]",
            ),
            // vlans by vlanId
            (
                "machine: {network: {interfaces: [{interface: eth0, vlans: [{vlanId: 10, addresses: [a]}]}]}}",
                "machine: {network: {interfaces: [{interface: eth0, vlans: [{vlanId: 10, addresses: [b]}, {vlanId: 20}]}]}}",
                &["machine", "network", "interfaces"],
                "[{interface: eth0, vlans: [{vlanId: 10, addresses: [a, b]}, {vlanId: 20}]}]",
            ),
            // admission plugins by name, their configuration merges
            (
                "cluster: {apiServer: {admissionControl: [{name: PodSecurity, configuration: {exemptions: {namespaces: [kube-system]}}}]}}",
                "cluster: {apiServer: {admissionControl: [{name: PodSecurity, configuration: {exemptions: {namespaces: [rook-ceph]}}}]}}",
                &["cluster", "apiServer", "admissionControl"],
                "[{name: PodSecurity, configuration: {exemptions: {namespaces: [kube-system, rook-ceph]}}}]",
            ),
            // extraArgs replace per key
            (
                "machine: {kubelet: {extraArgs: {a: '1', b: '2'}}}",
                "machine: {kubelet: {extraArgs: {b: '3', c: '4'}}}",
                &["machine", "kubelet", "extraArgs"],
                "{a: '1', b: '3', c: '4'}",
            ),
        ];
        for (base, patch, path, want) in cases {
            let base = format!("version: v1alpha1\n{base}");
            let out = patched(&base, &[patch]).expect("apply");
            let mut got = &out.documents()[0];
            for k in *path {
                got = &got[*k];
            }
            assert_eq!(got, &yaml(want), "patch {patch}");
        }
    }

    #[test]
    fn non_v1alpha1_documents_use_their_own_rules() {
        let base = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: foo\nconfigFiles: [{content: a, mountPath: /etc/a}]\nenvironment: [X=1]\n";
        let patch = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: foo\nconfigFiles: [{content: b, mountPath: /etc/a}, {content: c, mountPath: /etc/c}]\nenvironment: [Y=2]\n";
        let out = patched(base, &[patch]).expect("apply");
        assert_eq!(
            out.documents()[0]["configFiles"],
            yaml("[{content: b, mountPath: /etc/a}, {content: c, mountPath: /etc/c}]")
        );
        assert_eq!(out.documents()[0]["environment"], yaml("[X=1, Y=2]"));
        // A document the config lacks is appended; another name is another document.
        let other = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: bar\n";
        let out = patched(base, &[other]).expect("apply");
        assert_eq!(out.documents().len(), 2);
    }

    #[test]
    fn deletes() {
        let base = "version: v1alpha1\nmachine:\n  network:\n    hostname: h\n    interfaces: [{interface: eth0}, {interface: eth1}]\n  nodeLabels: {a: '1', b: '2'}\n---\napiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://x\n";
        let patch = "machine:\n  network:\n    hostname: {$patch: delete}\n    interfaces: [{interface: eth1, $patch: delete}]\n  nodeLabels:\n    a: {$patch: delete}\n---\napiVersion: v1alpha1\nkind: SideroLinkConfig\n$patch: delete\n";
        let out = patched(base, &[patch]).expect("apply");
        assert_eq!(out.documents().len(), 1);
        assert_eq!(
            out.documents()[0]["machine"],
            yaml("{network: {interfaces: [{interface: eth0}]}, nodeLabels: {b: '2'}}")
        );
    }

    #[test]
    fn delete_errors_name_the_path() {
        let e = patched(
            "version: v1alpha1\nmachine: {}\n",
            &["machine: {network: {hostname: {$patch: delete}}}"],
        )
        .expect_err("missing parent");
        assert!(
            e.to_string()
                .contains("path 'machine.network.hostname' in document v1alpha1"),
            "{e}"
        );
        let e = patched(
            "version: v1alpha1\nmachine: {network: {interfaces: [{interface: eth0}]}}\n",
            &["machine: {network: {interfaces: [{interface: eth9, $patch: delete}]}}"],
        )
        .expect_err("missing item");
        assert!(
            e.to_string()
                .contains("machine.network.interfaces[interface=eth9]"),
            "{e}"
        );
        let e = load_patch("version: v1alpha1\n$patch: delete\n").expect_err("root");
        assert!(e.to_string().contains("cannot be deleted"), "{e}");
        let e = load_patch(
            "machine: {network: {interfaces: [{interface: eth0, mtu: {$patch: delete}}]}}",
        )
        .expect_err("inner key of item");
        assert!(
            e.to_string().contains("machine.network.interfaces[0].mtu"),
            "{e}"
        );
        let e = load_patch("machine: {network: {$patch: replace}}").expect_err("replace");
        assert!(e.to_string().contains("only `$patch: delete`"), "{e}");
        // Deleting from a document the config lacks is a no-op, as in Talos.
        patched(
            "version: v1alpha1\n",
            &["apiVersion: v1alpha1\nkind: KubeFlannelCNIConfig\n$patch: delete\n"],
        )
        .expect("skip");
    }

    #[test]
    fn type_mismatch_is_an_error() {
        let e = patched(
            "version: v1alpha1\nmachine: {certSANs: [a]}\n",
            &["machine: {certSANs: {a: b}}"],
        )
        .expect_err("mismatch");
        assert_eq!(
            e.to_string(),
            "cannot merge a mapping into a list at machine.certSANs in document v1alpha1"
        );
    }

    #[test]
    fn json_patch_operations() {
        let base = "version: v1alpha1\nmachine: {certSANs: [a, b], network: {hostname: h}}\n";
        let ops = r#"[
            {"op": "add", "path": "/machine/certSANs/-", "value": "c"},
            {"op": "add", "path": "/machine/certSANs/0", "value": "z"},
            {"op": "remove", "path": "/machine/certSANs/1"},
            {"op": "replace", "path": "/machine/network/hostname", "value": "n1"},
            {"op": "copy", "from": "/machine/network/hostname", "path": "/machine/name"},
            {"op": "move", "from": "/machine/name", "path": "/machine/moved"},
            {"op": "test", "path": "/machine/moved", "value": "n1"}
        ]"#;
        let out = patched(base, &[ops]).expect("apply");
        assert_eq!(
            out.documents()[0]["machine"],
            yaml("{certSANs: [z, b, c], network: {hostname: n1}, moved: n1}")
        );
        let e = patched(base, &["- {op: replace, path: /machine/nope, value: 1}"])
            .expect_err("missing");
        assert!(e.to_string().contains("(replace machine.nope)"), "{e}");
        let e = patched(
            base,
            &["- {op: test, path: /machine/network/hostname, value: x}"],
        )
        .expect_err("test");
        assert!(e.to_string().contains("test failed"), "{e}");
        let e = load_patch("- {op: frobnicate, path: /a}").expect_err("op");
        assert!(e.to_string().contains("unknown op"), "{e}");
    }

    #[test]
    fn json_patch_refused_on_multi_document_config() {
        let e = patched(
            "version: v1alpha1\n---\napiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://x\n",
            &["- {op: add, path: /debug, value: true}"],
        )
        .expect_err("multidoc");
        assert!(matches!(e, PatchError::JsonPatchMultiDocument(2)), "{e}");
    }

    #[test]
    fn detection() {
        assert!(matches!(
            load_patch("[]").expect("empty json patch"),
            Patch::Json(_)
        ));
        assert!(matches!(
            load_patch("machine: {}").expect("smp"),
            Patch::Strategic(_)
        ));
        assert!(load_patch("").is_err());
        assert!(load_patch("just a string").is_err());
    }
}

//! Talos' own patch conformance vectors (../shared/talos/patches, from
//! pkg/machinery/config/configpatcher/testdata): Plinth's patcher must produce the documents
//! Talos produces. Compared as YAML data after dropping empty values (`""`, `[]`, `{}`, null),
//! which Talos' typed re-encoding adds or omits per field and which mean "unset" to Talos.

use std::path::PathBuf;

use plinth::talos::patch::{apply, load_patch_file, Patch, PatchError};
use plinth::talos::MachineConfig;
use serde_yaml_ng::Value;

fn shared() -> PathBuf {
    crate::support::shared().join("talos/patches")
}

fn config(rel: &str) -> MachineConfig {
    let text = std::fs::read_to_string(shared().join(rel)).expect("read config");
    MachineConfig::parse(&text).expect("parse config")
}

fn patches(rels: &[&str]) -> Vec<Patch> {
    rels.iter()
        .map(|r| load_patch_file(&shared().join(r)).expect("load patch"))
        .collect()
}

/// Drop values Talos treats as unset, recursively.
fn pruned(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Sequence(items) => {
            let items: Vec<Value> = items.iter().filter_map(pruned).collect();
            (!items.is_empty()).then_some(Value::Sequence(items))
        }
        Value::Mapping(m) => {
            let m: serde_yaml_ng::Mapping = m
                .iter()
                .filter_map(|(k, v)| pruned(v).map(|v| (k.clone(), v)))
                .collect();
            (!m.is_empty()).then_some(Value::Mapping(m))
        }
        other => Some(other.clone()),
    }
}

fn assert_same(got: &MachineConfig, want: &MachineConfig) {
    let g: Vec<Option<Value>> = got.documents().iter().map(pruned).collect();
    let w: Vec<Option<Value>> = want.documents().iter().map(pruned).collect();
    assert_eq!(
        g,
        w,
        "\n--- got ---\n{}\n--- want ---\n{}",
        got.to_yaml().expect("yaml"),
        want.to_yaml().expect("yaml")
    );
}

#[test]
fn apply_vector() {
    let out = apply(
        &config("apply/config.yaml"),
        &patches(&[
            "apply/strategic1.yaml",
            "apply/jsonpatch1.yaml",
            "apply/jsonpatch2.yaml",
            "apply/strategic2.yaml",
            "apply/strategic3.yaml",
        ]),
    )
    .expect("apply");
    assert_same(&out, &config("apply/expected.yaml"));
}

#[test]
fn apply_vector_inline_manifest_newline() {
    let out = apply(
        &config("apply/config.yaml"),
        &patches(&["apply/strategic4.yaml"]),
    )
    .expect("apply");
    assert_same(&out, &config("apply/expected_manifests.yaml"));
}

#[test]
fn patchdelete_multidoc_vector() {
    let out = apply(
        &config("patchdelete/config.yaml"),
        &patches(&["patchdelete/strategic1.yaml"]),
    )
    .expect("apply");
    assert_same(&out, &config("patchdelete/expected.yaml"));
}

#[test]
fn patchdelete_controlplane_vector() {
    let out = apply(
        &config("patchdelete/controlplane_orig.yaml"),
        &patches(&[
            "patchdelete/strategic2.yaml",
            "patchdelete/strategic3.yaml",
            "patchdelete/strategic4.yaml",
        ]),
    )
    .expect("apply");
    assert_same(&out, &config("patchdelete/controlplane_expected.yaml"));
}

#[test]
fn json_patch_refused_on_the_multidoc_vector() {
    let e = apply(
        &config("patchdelete/config.yaml"),
        &patches(&["apply/jsonpatch1.yaml"]),
    )
    .expect_err("multi-document");
    assert!(matches!(e, PatchError::JsonPatchMultiDocument(3)), "{e}");
}

#[test]
fn strategic_patches_of_the_vectors_are_detected() {
    for p in patches(&["apply/strategic1.yaml", "patchdelete/strategic1.yaml"]) {
        assert!(matches!(p, Patch::Strategic(_)));
    }
    for p in patches(&["apply/jsonpatch1.yaml", "apply/jsonpatch2.yaml"]) {
        assert!(matches!(p, Patch::Json(_)));
    }
}

/// Talos' verdict on a `$patch: delete`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delete {
    /// The value is gone.
    Removed,
    /// Accepted, nothing to remove (an unset struct field, zeroed; an absent document, skipped).
    Unchanged,
    /// Refused: "lookup failed".
    LookupFailed,
}

/// The file whose rules decide every case below: `deleteForPath` of Talos' delete selector. From
/// v1.12 an unset pointer on the way is "lookup failed"; v1.11.6 has no such check and panics
/// there instead (talosctl dies), so it refuses too.
const SELECTOR: &str = "pkg/machinery/config/configloader/internal/decoder/selector.go";

struct DeleteCase {
    name: &'static str,
    config: &'static str,
    patch: &'static str,
    /// Where to look (v1alpha1 keys, or `Kind:key`) to see a removal.
    at: &'static str,
    /// The verdict for 1.11, 1.12, 1.13, 1.14 (`selector.go` reads the same from v1.12.11 to
    /// v1.14.0-rc.1 for these cases).
    verdicts: [Delete; 4],
}

const CFG: &str = "version: v1alpha1\nmachine:\n  type: worker\n  install:\n    disk: /dev/sda\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:v1.34.1\n    extraArgs:\n      v: '2'\n  network:\n    interfaces: [{interface: eth0, dhcp: true}]\n  sysctls:\n    net.ipv4.ip_forward: '1'\ncluster:\n  discovery:\n    enabled: true\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n";

const DELETE_CASES: &[DeleteCase] = &[
    DeleteCase {
        name: "a map key that is there",
        config: CFG,
        patch: "machine: {kubelet: {extraArgs: {v: {$patch: delete}}}}",
        at: "machine.kubelet.extraArgs.v",
        verdicts: [Delete::Removed; 4],
    },
    DeleteCase {
        name: "a map key the map does not hold",
        config: CFG,
        patch: "machine: {kubelet: {extraArgs: {feature-gates: {$patch: delete}}}}",
        at: "machine.kubelet.extraArgs.feature-gates",
        verdicts: [Delete::LookupFailed; 4],
    },
    DeleteCase {
        name: "a sysctl that is not set",
        config: CFG,
        patch: "machine: {sysctls: {vm.max_map_count: {$patch: delete}}}",
        at: "machine.sysctls.vm.max_map_count",
        verdicts: [Delete::LookupFailed; 4],
    },
    DeleteCase {
        name: "a key of a map that is not set at all",
        config: CFG,
        patch: "machine: {nodeLabels: {zone: {$patch: delete}}}",
        at: "machine.nodeLabels.zone",
        verdicts: [Delete::LookupFailed; 4],
    },
    DeleteCase {
        name: "a struct field that is set",
        config: CFG,
        patch: "machine: {kubelet: {image: {$patch: delete}}}",
        at: "machine.kubelet.image",
        verdicts: [Delete::Removed; 4],
    },
    DeleteCase {
        name: "a struct field that is not set (zeroed)",
        config: CFG,
        patch: "machine: {network: {hostname: {$patch: delete}}}",
        at: "machine.network.hostname",
        verdicts: [Delete::Unchanged; 4],
    },
    DeleteCase {
        name: "a hidden (docgen:nodoc) field that is not set",
        config: CFG,
        patch: "machine: {install: {bootloader: {$patch: delete}}}",
        at: "machine.install.bootloader",
        verdicts: [Delete::Unchanged; 4],
    },
    DeleteCase {
        name: "through an unset pointer (Talos' patchdeletemissing vector)",
        config: "version: v1alpha1\nmachine: {}\n",
        patch: "machine: {network: {hostname: {$patch: delete}}}",
        at: "machine.network.hostname",
        verdicts: [Delete::LookupFailed; 4],
    },
    DeleteCase {
        name: "a name that is no field",
        config: CFG,
        patch: "machine: {kubelet: {imagee: {$patch: delete}}}",
        at: "machine.kubelet.imagee",
        verdicts: [Delete::LookupFailed; 4],
    },
    DeleteCase {
        name: "through an unset struct value (machine.registries) into its map",
        config: CFG,
        patch: "machine: {registries: {mirrors: {docker.io: {$patch: delete}}}}",
        at: "machine.registries.mirrors.docker.io",
        verdicts: [Delete::LookupFailed; 4],
    },
    DeleteCase {
        name: "through unset struct values (cluster.discovery.registries) to a field",
        config: CFG,
        patch: "cluster: {discovery: {registries: {kubernetes: {disabled: {$patch: delete}}}}}",
        at: "cluster.discovery.registries.kubernetes.disabled",
        verdicts: [Delete::Unchanged; 4],
    },
    DeleteCase {
        name: "a list item that is not there",
        config: CFG,
        patch: "machine: {network: {interfaces: [{interface: eth9, $patch: delete}]}}",
        at: "machine.network.interfaces",
        verdicts: [Delete::LookupFailed; 4],
    },
    DeleteCase {
        name: "a field of another document, not set",
        config: CFG,
        patch: "apiVersion: v1alpha1\nkind: HostnameConfig\nhostname:\n  $patch: delete\n",
        at: "HostnameConfig:hostname",
        verdicts: [Delete::Unchanged; 4],
    },
    DeleteCase {
        name: "a name that is no field of another document",
        config: CFG,
        patch: "apiVersion: v1alpha1\nkind: HostnameConfig\nhostnam:\n  $patch: delete\n",
        at: "HostnameConfig:hostnam",
        verdicts: [Delete::LookupFailed; 4],
    },
    DeleteCase {
        name: "a document the config does not have (skipped)",
        config: CFG,
        patch: "apiVersion: v1alpha1\nkind: ResolverConfig\n$patch: delete\n",
        at: "ResolverConfig:nameservers",
        verdicts: [Delete::Unchanged; 4],
    },
];

fn lookup<'a>(cfg: &'a MachineConfig, at: &str) -> Option<&'a Value> {
    let (doc, keys): (&Value, Vec<&str>) = match at.split_once(':') {
        Some((kind, key)) => (
            cfg.documents()
                .iter()
                .find(|d| d.get("kind").and_then(Value::as_str) == Some(kind))?,
            vec![key],
        ),
        // Keys may hold dots (`vm.max_map_count`): take the longest key that exists.
        None => (cfg.v1alpha1()?, at.split('.').collect()),
    };
    let mut node = doc;
    let mut i = 0;
    while i < keys.len() {
        let mut found = None;
        for j in (i + 1..=keys.len()).rev() {
            if let Some(v) = node.get(keys[i..j].join(".")) {
                found = Some((v, j));
                break;
            }
        }
        let (v, j) = found?;
        node = v;
        i = j;
    }
    Some(node)
}

/// Conformance with Talos' delete selector, one case per rule of `deleteForPath`.
#[test]
fn patch_delete_decides_as_talos_does() {
    let mut failures = Vec::new();
    for case in DELETE_CASES {
        let cfg = MachineConfig::parse(case.config).expect(case.name);
        let patch = plinth::talos::patch::load_patch(case.patch).expect(case.name);
        let before = lookup(&cfg, case.at).cloned();
        let got = match apply(&cfg, &[patch]) {
            Ok(out) => match (before.is_some(), lookup(&out, case.at).is_some()) {
                (true, false) => Delete::Removed,
                (false, false) => Delete::Unchanged,
                (_, true) if before.as_ref() == lookup(&out, case.at) => Delete::Unchanged,
                _ => {
                    failures.push(format!("{}: the value changed but stayed", case.name));
                    continue;
                }
            },
            Err(e) => {
                let text = e.to_string();
                if text.contains("lookup failed") && text.contains("patch delete") {
                    Delete::LookupFailed
                } else {
                    failures.push(format!("{}: unexpected error {text}", case.name));
                    continue;
                }
            }
        };
        // Plinth is one patcher for every release: the four verdicts must agree for a case to be
        // portable, and Plinth's must equal them.
        for (i, want) in case.verdicts.iter().enumerate() {
            if got != *want {
                failures.push(format!(
                    "{} (1.{}): Talos ({SELECTOR}) says {want:?}, Plinth {got:?}",
                    case.name,
                    11 + i
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

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

//! What a place in a config document is, in Talos' Go types as its embedded JSON schemas
//! describe them: a field of a struct, a key of a map, or nothing Talos decodes. The patch
//! engine asks this when a `$patch: delete` names a key the config does not hold, because Talos'
//! delete selector (`deleteForPath` in
//! `pkg/machinery/config/configloader/internal/decoder/selector.go`, v1.11.6 to v1.14.0-rc.1)
//! decides by type: a struct field is zeroed whether it was set or not, while a missing map key
//! or a name that is no field fails with "lookup failed".
//!
//! Pure data over the schemas embedded in [`super`]; no I/O.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::{FieldTree, DECODER_KINDS, EMBEDDED_SCHEMAS, HIDDEN_SINCE_1_11};
use crate::talos::{DocumentId, V1ALPHA1};

/// What a key under some place of a document is to Talos' decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A struct field (documented, or hidden from the docs but decoded).
    Field,
    /// A key of a map (`extraArgs`, `sysctls`, `nodeLabels`, registry mirrors...).
    MapKey,
    /// A name that is no field of the struct there.
    NotAField,
    /// No schema describes the place (free-form values, kinds no schema has).
    Unknown,
}

/// Each document kind's shape in one schema: (apiVersion, kind) -> shape.
type KindTrees = HashMap<(String, String), FieldTree>;

/// Every document kind's shape, per embedded schema: (minor, shapes).
fn kind_trees() -> &'static [(u32, KindTrees)] {
    static TREES: OnceLock<Vec<(u32, KindTrees)>> = OnceLock::new();
    TREES.get_or_init(|| {
        EMBEDDED_SCHEMAS
            .iter()
            .filter_map(|(_, minor, _, text)| {
                let schema: serde_json::Value = serde_json::from_str(text).ok()?;
                let defs = schema.get("$defs")?.as_object()?;
                let mut kinds = HashMap::new();
                for def in defs.values() {
                    let first_enum = |prop: &str| -> Option<String> {
                        def.get("properties")?
                            .get(prop)?
                            .get("enum")?
                            .get(0)?
                            .as_str()
                            .map(str::to_string)
                    };
                    let key = match (first_enum("apiVersion"), first_enum("kind")) {
                        (Some(a), Some(k)) => {
                            // Kinds the schema misspells are decoded under Talos' own name.
                            let k = DECODER_KINDS
                                .iter()
                                .find(|(api, _, _, entry)| {
                                    *api == a
                                        && matches!(entry, super::SchemaEntry::SpelledAs(s) if *s == k)
                                })
                                .map(|(_, kind, _, _)| kind.to_string())
                                .unwrap_or(k);
                            (a, k)
                        }
                        _ if first_enum("version").is_some() => {
                            (String::new(), V1ALPHA1.to_string())
                        }
                        _ => continue,
                    };
                    kinds.insert(key, FieldTree::from_def(&schema, def, 0));
                }
                Some((*minor, kinds))
            })
            .collect()
    })
}

/// The shape at `parent` (keys from the document root) in one schema's tree.
fn tree_at<'a>(tree: &'a FieldTree, parent: &[String]) -> Option<&'a FieldTree> {
    let mut node = tree;
    for k in parent {
        node = match (node.keys.get(k), &node.any_key) {
            (Some(t), _) => t,
            (None, Some(t)) => t,
            (None, None) => return None,
        };
    }
    Some(node)
}

/// What the last of `keys` (keys from the root of document `doc`) is to Talos, by the embedded
/// schemas of every release that has the kind: a field if any release documents it (Talos' types
/// only grew from 1.11 to 1.14) or it is a v1alpha1 field hidden from the docs; a map key if the
/// place is a map in every release that knows it.
pub fn place_of(doc: &DocumentId, keys: &[String]) -> Place {
    let Some((last, parent)) = keys.split_last() else {
        return Place::Unknown;
    };
    let id = (doc.api_version.clone(), doc.kind.clone());
    let mut verdict = Place::Unknown;
    for (_, kinds) in kind_trees() {
        let Some(node) = kinds.get(&id).and_then(|t| tree_at(t, parent)) else {
            continue;
        };
        let here = if node.keys.contains_key(last) {
            Place::Field
        } else if !node.keys.is_empty() {
            Place::NotAField
        } else if node.any_key.is_some() {
            Place::MapKey
        } else {
            // A leaf or a free-form object: the schema does not say.
            Place::Unknown
        };
        verdict = match (verdict, here) {
            (Place::Field, _) | (_, Place::Field) => Place::Field,
            (Place::Unknown, h) => h,
            (v, Place::Unknown) => v,
            (Place::MapKey, Place::MapKey) => Place::MapKey,
            (Place::NotAField, Place::NotAField) => Place::NotAField,
            // A map in one release and a struct in another: say nothing.
            _ => Place::Unknown,
        };
    }
    if verdict == Place::NotAField && doc.kind == V1ALPHA1 && doc.api_version.is_empty() {
        let path = keys.join(".");
        if HIDDEN_SINCE_1_11
            .iter()
            .any(|h| path == *h || path.starts_with(&format!("{h}.")))
        {
            return Place::Field;
        }
    }
    verdict
}

/// Places of the v1alpha1 document that Talos' types hold as struct values, not pointers
/// (`v1alpha1_types.go`, v1.11.6 to v1.14.0-rc.1): Talos' delete selector walks into them even
/// when the config does not set them, where an unset pointer is "lookup failed".
pub const V1ALPHA1_VALUE_STRUCTS: &[&str] = &[
    "machine.registries",
    "cluster.discovery.registries",
    "cluster.discovery.registries.kubernetes",
    "cluster.discovery.registries.service",
];

/// Whether `keys` of document `doc` is a struct value Talos walks into even when unset.
pub fn is_value_struct(doc: &DocumentId, keys: &[String]) -> bool {
    doc.kind == V1ALPHA1
        && doc.api_version.is_empty()
        && V1ALPHA1_VALUE_STRUCTS.contains(&keys.join(".").as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys from `a.b.c`, or `a.b|c.d` where the last key holds dots.
    fn keys(p: &str) -> Vec<String> {
        let (head, last) = p.split_once('|').unwrap_or((p, ""));
        let mut k: Vec<String> = head.split('.').map(str::to_string).collect();
        if !last.is_empty() {
            k.push(last.to_string());
        }
        k
    }

    #[test]
    fn places_of_the_v1alpha1_document() {
        let v1 = DocumentId::v1alpha1();
        for (path, want) in [
            ("machine.network.hostname", Place::Field),
            ("machine.install.disk", Place::Field),
            ("machine.sysctls|net.ipv4.ip_forward", Place::MapKey),
            (
                "machine.kubelet.extraArgs.rotate-server-certificates",
                Place::MapKey,
            ),
            ("machine.nodeLabels.zone", Place::MapKey),
            ("machine.registries.mirrors|docker.io", Place::MapKey),
            ("machine.install.diskk", Place::NotAField),
            ("machine.bogus", Place::NotAField),
            // docgen:nodoc, still decoded.
            ("persist", Place::Field),
            ("machine.install.bootloader", Place::Field),
            ("cluster.allowSchedulingOnMasters", Place::Field),
        ] {
            assert_eq!(place_of(&v1, &keys(path)), want, "{path}");
        }
    }

    #[test]
    fn places_of_other_kinds() {
        let doc = |kind: &str| DocumentId {
            api_version: "v1alpha1".into(),
            kind: kind.into(),
            name: None,
        };
        assert_eq!(
            place_of(&doc("HostnameConfig"), &keys("hostname")),
            Place::Field
        );
        assert_eq!(
            place_of(&doc("HostnameConfig"), &keys("hostnam")),
            Place::NotAField
        );
        assert_eq!(
            place_of(
                &doc("KubeSpanEndpointsConfig"),
                &keys("extraAnnouncedEndpoints")
            ),
            Place::Field
        );
        assert_eq!(place_of(&doc("NoSuchConfig"), &keys("a")), Place::Unknown);
    }
}

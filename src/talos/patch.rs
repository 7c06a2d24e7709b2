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

use std::fmt;
use std::path::{Path, PathBuf};

use serde_yaml_ng::{Mapping, Value};

use super::{
    document_id_at, kind_name, normalise_document, parse_documents, path_text, scalar_text,
    ConfigError, DocumentId, MachineConfig, Seg,
};

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

/// How a list or mapping at a given place merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeRule {
    /// Lists append; mappings merge key by key.
    Default,
    /// The patch value replaces the config value wholesale (`merge:"replace"` in Talos).
    Replace,
    /// List items that agree on the first of these keys the patch item sets are merged; others
    /// are appended.
    KeyedMerge(&'static [&'static str]),
    /// List items that agree on this key are replaced by the patch item; others are appended.
    KeyedReplace(&'static str),
    /// Mapping values replace per key (Talos `extraArgs`).
    PerKey,
}

/// The typed merge rules of Talos, by document kind and path (`[]` stands for "any list item").
/// Sources: fields tagged `merge:"replace"` and types with their own `Merge` method in Talos'
/// `pkg/machinery/config/types`.
pub const RULES: &[(&str, &str, MergeRule)] = &[
    (
        "v1alpha1",
        "machine.network.interfaces",
        MergeRule::KeyedMerge(&["interface", "deviceSelector"]),
    ),
    (
        "v1alpha1",
        "machine.network.interfaces[].vlans",
        MergeRule::KeyedMerge(&["vlanId"]),
    ),
    (
        "v1alpha1",
        "cluster.apiServer.admissionControl",
        MergeRule::KeyedMerge(&["name"]),
    ),
    ("v1alpha1", "cluster.network.podSubnets", MergeRule::Replace),
    (
        "v1alpha1",
        "cluster.network.serviceSubnets",
        MergeRule::Replace,
    ),
    (
        "v1alpha1",
        "cluster.apiServer.auditPolicy",
        MergeRule::Replace,
    ),
    ("v1alpha1", "machine.kubelet.extraArgs", MergeRule::PerKey),
    ("v1alpha1", "cluster.apiServer.extraArgs", MergeRule::PerKey),
    (
        "v1alpha1",
        "cluster.controllerManager.extraArgs",
        MergeRule::PerKey,
    ),
    ("v1alpha1", "cluster.scheduler.extraArgs", MergeRule::PerKey),
    ("v1alpha1", "cluster.proxy.extraArgs", MergeRule::PerKey),
    ("v1alpha1", "cluster.etcd.extraArgs", MergeRule::PerKey),
    (
        "ExtensionServiceConfig",
        "configFiles",
        MergeRule::KeyedMerge(&["mountPath"]),
    ),
    ("NetworkRuleConfig", "ingress", MergeRule::Replace),
    (
        "NetworkRuleConfig",
        "portSelector.ports",
        MergeRule::Replace,
    ),
    ("KubeNetworkConfig", "podSubnets", MergeRule::Replace),
    ("KubeNetworkConfig", "serviceSubnets", MergeRule::Replace),
    ("KubeAuditPolicyConfig", "configuration", MergeRule::Replace),
    (
        "KubeAuthenticationConfig",
        "configuration",
        MergeRule::Replace,
    ),
    (
        "KubeCredentialProviderConfig",
        "configuration",
        MergeRule::Replace,
    ),
    ("KubeStaticPodConfig", "pod", MergeRule::Replace),
    ("BGPInstanceConfig", "advertise", MergeRule::Replace),
    ("BGPInstanceConfig", "importRoutes", MergeRule::Replace),
    ("BGPInstanceConfig", "neighbors", MergeRule::Replace),
    ("CRIBaseRuntimeSpecConfig", "overrides", MergeRule::Replace),
    (
        "ImageVerificationConfig",
        "rules",
        MergeRule::KeyedReplace("image"),
    ),
    ("KubeAPIServerConfig", "extraArgs", MergeRule::PerKey),
    (
        "KubeControllerManagerConfig",
        "extraArgs",
        MergeRule::PerKey,
    ),
    ("KubeSchedulerConfig", "extraArgs", MergeRule::PerKey),
    ("KubeProxyConfig", "extraArgs", MergeRule::PerKey),
    ("KubeletConfig", "extraArgs", MergeRule::PerKey),
];

/// The merge rule for a place in a document of the given kind.
pub fn rule_for(kind: &str, rule_path: &str) -> MergeRule {
    RULES
        .iter()
        .find(|(k, p, _)| *k == kind && *p == rule_path)
        .map(|(_, _, r)| *r)
        .unwrap_or(MergeRule::Default)
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

// ---------------------------------------------------------------------------------------------
// Strategic merge patches
// ---------------------------------------------------------------------------------------------

/// A strategic merge patch: documents to merge and `$patch: delete` selectors, in the order
/// Talos runs them.
#[derive(Clone, Debug, PartialEq)]
pub struct StrategicPatch {
    steps: Vec<Step>,
}

#[derive(Clone, Debug, PartialEq)]
enum Step {
    Delete(DeleteSelector),
    Merge { id: DocumentId, doc: Value },
}

/// What a `$patch: delete` removes.
#[derive(Clone, Debug, PartialEq)]
struct DeleteSelector {
    doc: DocumentId,
    /// Keys from the document root; empty for the whole document.
    keys: Vec<String>,
    /// For a list item: the list is at `keys`, the item is the one whose `key` equals `value`.
    item: Option<(String, Value)>,
}

impl DeleteSelector {
    fn path(&self) -> String {
        let p: Vec<Seg> = self.keys.iter().cloned().map(Seg::Key).collect();
        if let Some((k, v)) = &self.item {
            let v = scalar_text(v).unwrap_or_else(|| "{...}".into());
            let mut s = path_text(&p);
            s.push_str(&format!("[{k}={v}]"));
            return s;
        }
        if p.is_empty() {
            return "(whole document)".into();
        }
        path_text(&p)
    }
}

impl StrategicPatch {
    /// Build a patch from parsed documents (each a mapping), extracting `$patch: delete`.
    pub fn from_documents(docs: Vec<Value>) -> Result<Self, PatchError> {
        let mut steps = Vec::new();
        for (index, mut doc) in docs.into_iter().enumerate() {
            let id = document_id_at(index, &doc)?;
            let mut deletes = Vec::new();
            let mut path = Vec::new();
            let remove_all = extract_deletes(&mut doc, &mut path, false, index, &mut deletes)?;
            for (path, item) in deletes {
                let keys: Vec<String> = path
                    .iter()
                    .filter_map(|s| match s {
                        Seg::Key(k) => Some(k.clone()),
                        Seg::Index(_) => None,
                    })
                    .collect();
                if keys.is_empty() && item.is_none() && id.is_v1alpha1() {
                    return Err(PatchError::BadDirective {
                        document: index,
                        path: "(document root)".into(),
                        reason: "the v1alpha1 document cannot be deleted; delete its keys instead"
                            .into(),
                    });
                }
                steps.push(Step::Delete(DeleteSelector {
                    doc: id.clone(),
                    keys,
                    item,
                }));
            }
            if remove_all || is_identity_only(&doc) {
                continue;
            }
            normalise_document(&mut doc);
            steps.push(Step::Merge { id, doc });
        }
        Ok(StrategicPatch { steps })
    }

    /// Apply to a config in place.
    pub fn apply_to(&self, config: &mut MachineConfig) -> Result<(), PatchError> {
        for step in &self.steps {
            match step {
                Step::Merge { id, doc } => match config.document_mut(id) {
                    Some(left) => {
                        let mut ctx = MergeCtx {
                            doc: id,
                            path: Vec::new(),
                            rule_path: String::new(),
                        };
                        merge_value(left, doc, &mut ctx)?;
                    }
                    None => config.documents_mut().push(doc.clone()),
                },
                Step::Delete(sel) => apply_delete(config, sel)?,
            }
        }
        Ok(())
    }
}

/// A found `$patch: delete`: its path in the patch, and for a list item the selecting key/value.
type FoundDelete = (Vec<Seg>, Option<(String, Value)>);

/// Walk a patch document, collecting `$patch: delete` directives and removing them (and any
/// mapping or list they leave empty) from the document. Returns whether `node` itself is to be
/// removed from its parent.
fn extract_deletes(
    node: &mut Value,
    path: &mut Vec<Seg>,
    parent_is_list: bool,
    document: usize,
    out: &mut Vec<FoundDelete>,
) -> Result<bool, PatchError> {
    match node {
        Value::Mapping(map) => {
            if let Some(directive) = map.get("$patch") {
                if directive.as_str() != Some("delete") {
                    return Err(PatchError::BadDirective {
                        document,
                        path: path_text(path),
                        reason: format!(
                            "`$patch: {}` is not supported; Talos knows only `$patch: delete`",
                            scalar_text(directive).unwrap_or_default()
                        ),
                    });
                }
                if parent_is_list {
                    // A list item: select it by its first other key.
                    let key = map
                        .iter()
                        .find(|(k, _)| k.as_str() != Some("$patch"))
                        .map(|(k, v)| (scalar_text(k).unwrap_or_default(), v.clone()));
                    let Some(item) = key else {
                        return Err(PatchError::BadDirective {
                            document,
                            path: path_text(path),
                            reason: "a deleted list item needs a key to find it by, e.g. `- interface: eth0` next to `$patch: delete`".into(),
                        });
                    };
                    // Talos cannot look into a list inside a list.
                    let inner = &path[..path.len().saturating_sub(1)];
                    if inner.iter().any(|s| matches!(s, Seg::Index(_))) {
                        return Err(PatchError::BadDirective {
                            document,
                            path: path_text(path),
                            reason: "cannot delete an item of a list nested in another list".into(),
                        });
                    }
                    out.push((path.clone(), Some(item)));
                } else {
                    if path.iter().any(|s| matches!(s, Seg::Index(_))) {
                        return Err(PatchError::BadDirective {
                            document,
                            path: path_text(path),
                            reason: "cannot delete an inner key of a list item; delete the whole item instead".into(),
                        });
                    }
                    out.push((path.clone(), None));
                }
                return Ok(true);
            }
            let keys: Vec<Value> = map.keys().cloned().collect();
            let mut removed_any = false;
            for k in keys {
                let remove = match map.get_mut(&k) {
                    Some(v) => {
                        path.push(Seg::Key(scalar_text(&k).unwrap_or_default()));
                        let r = extract_deletes(v, path, false, document, out);
                        path.pop();
                        r?
                    }
                    None => false,
                };
                if remove {
                    map.shift_remove(&k);
                    removed_any = true;
                }
            }
            Ok(removed_any && map.is_empty())
        }
        Value::Sequence(items) => {
            let mut removed_any = false;
            let mut i = 0;
            while i < items.len() {
                path.push(Seg::Index(i));
                let r = extract_deletes(&mut items[i], path, true, document, out);
                path.pop();
                if r? {
                    items.remove(i);
                    removed_any = true;
                } else {
                    i += 1;
                }
            }
            Ok(removed_any && items.is_empty())
        }
        Value::Tagged(t) => extract_deletes(&mut t.value, path, parent_is_list, document, out),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => Ok(false),
    }
}

/// A patch document holding nothing but its identity (Talos drops these: `version`, `kind`,
/// `name` only).
fn is_identity_only(doc: &Value) -> bool {
    doc.as_mapping().is_some_and(|m| {
        m.iter().all(|(k, v)| {
            matches!(k.as_str(), Some("version" | "kind" | "name")) && scalar_text(v).is_some()
        })
    })
}

fn apply_delete(config: &mut MachineConfig, sel: &DeleteSelector) -> Result<(), PatchError> {
    let docs = config.documents_mut();
    let Some(pos) = docs
        .iter()
        .position(|d| DocumentId::of(d).as_ref() == Some(&sel.doc))
    else {
        // Talos skips delete selectors for documents the config does not have.
        return Ok(());
    };
    if sel.keys.is_empty() && sel.item.is_none() {
        docs.remove(pos);
        return Ok(());
    }
    let fail = |reason: String| PatchError::DeleteFailed {
        doc: sel.doc.to_string(),
        path: sel.path(),
        reason,
    };
    let (parent_keys, last) = match &sel.item {
        Some(_) => (&sel.keys[..], None),
        None => match sel.keys.split_last() {
            Some((last, parents)) => (parents, Some(last)),
            None => (&sel.keys[..], None),
        },
    };
    let mut node = &mut docs[pos];
    for k in parent_keys {
        node = match node.get_mut(k.as_str()) {
            Some(v) if !v.is_null() => v,
            _ => return Err(fail(format!("lookup failed: `{k}` is not set"))),
        };
    }
    match (last, &sel.item) {
        (Some(key), _) => match node.as_mapping_mut() {
            // A key that is already absent is already deleted (Talos zeroes struct fields).
            Some(m) => {
                m.shift_remove(key.as_str());
                Ok(())
            }
            None => Err(fail(format!(
                "lookup failed: not a mapping but {}",
                kind_name(node)
            ))),
        },
        (None, Some((key, value))) => {
            let Some(items) = node.as_sequence_mut() else {
                return Err(fail(format!(
                    "lookup failed: not a list but {}",
                    kind_name(node)
                )));
            };
            let found = items.iter().position(|it| {
                it.get(key.as_str())
                    .is_some_and(|v| same_key_value(v, value))
            });
            match found {
                Some(i) => {
                    items.remove(i);
                    Ok(())
                }
                None => Err(fail("lookup failed: no such list item".into())),
            }
        }
        (None, None) => Ok(()),
    }
}

/// Key values compare as text for scalars (`vlanId: 100` matches `"100"`), structurally otherwise.
fn same_key_value(a: &Value, b: &Value) -> bool {
    match (scalar_text(a), scalar_text(b)) {
        (Some(x), Some(y)) => x == y,
        (None, None) => a == b,
        _ => false,
    }
}

struct MergeCtx<'a> {
    doc: &'a DocumentId,
    path: Vec<Seg>,
    /// The path in rule form: keys joined by `.`, list items as `[]`.
    rule_path: String,
}

impl MergeCtx<'_> {
    fn rule(&self) -> MergeRule {
        rule_for(&self.doc.kind, &self.rule_path)
    }

    fn push_key(&mut self, k: &str) -> usize {
        let len = self.rule_path.len();
        if !self.rule_path.is_empty() {
            self.rule_path.push('.');
        }
        self.rule_path.push_str(k);
        self.path.push(Seg::Key(k.to_string()));
        len
    }

    fn push_item(&mut self, i: usize) -> usize {
        let len = self.rule_path.len();
        self.rule_path.push_str("[]");
        self.path.push(Seg::Index(i));
        len
    }

    fn pop(&mut self, len: usize) {
        self.rule_path.truncate(len);
        self.path.pop();
    }

    fn mismatch(&self, left: &Value, right: &Value) -> PatchError {
        PatchError::TypeMismatch {
            doc: self.doc.to_string(),
            path: path_text(&self.path),
            left: kind_name(left),
            right: kind_name(right),
        }
    }
}

/// A zero value in a patch, which Talos does not merge over a set value.
fn is_zero_scalar(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

fn merge_value(left: &mut Value, right: &Value, ctx: &mut MergeCtx<'_>) -> Result<(), PatchError> {
    if right.is_null() {
        return Ok(());
    }
    if left.is_null() {
        *left = right.clone();
        return Ok(());
    }
    let collection = |v: &Value| matches!(v, Value::Mapping(_) | Value::Sequence(_));
    let same_shape = matches!(
        (&*left, right),
        (Value::Mapping(_), Value::Mapping(_)) | (Value::Sequence(_), Value::Sequence(_))
    );
    if !same_shape && (collection(left) || collection(right)) {
        return Err(ctx.mismatch(left, right));
    }
    if !same_shape {
        if !is_zero_scalar(right) {
            *left = right.clone();
        }
        return Ok(());
    }
    let rule = ctx.rule();
    if rule == MergeRule::Replace {
        *left = right.clone();
        return Ok(());
    }
    match (left, right) {
        (Value::Mapping(l), Value::Mapping(r)) => {
            if rule == MergeRule::PerKey {
                for (k, v) in r {
                    if !v.is_null() {
                        l.insert(k.clone(), v.clone());
                    }
                }
            } else {
                merge_mapping(l, r, ctx)?;
            }
        }
        (Value::Sequence(l), Value::Sequence(r)) => match rule {
            MergeRule::KeyedMerge(keys) => {
                for item in r {
                    match find_keyed(l, item, keys) {
                        Some(i) => {
                            let len = ctx.push_item(i);
                            let res = merge_value(&mut l[i], item, ctx);
                            ctx.pop(len);
                            res?;
                        }
                        None => l.push(item.clone()),
                    }
                }
            }
            MergeRule::KeyedReplace(key) => {
                for item in r {
                    match find_keyed(l, item, &[key]) {
                        Some(i) => l[i] = item.clone(),
                        None => l.push(item.clone()),
                    }
                }
            }
            MergeRule::Default | MergeRule::PerKey | MergeRule::Replace => {
                l.extend(r.iter().cloned())
            }
        },
        _ => {}
    }
    Ok(())
}

fn merge_mapping(l: &mut Mapping, r: &Mapping, ctx: &mut MergeCtx<'_>) -> Result<(), PatchError> {
    for (k, rv) in r {
        match l.get_mut(k) {
            Some(lv) if !lv.is_null() => {
                let len = ctx.push_key(&scalar_text(k).unwrap_or_default());
                let res = merge_value(lv, rv, ctx);
                ctx.pop(len);
                res?;
            }
            Some(lv) => *lv = rv.clone(),
            None => {
                l.insert(k.clone(), rv.clone());
            }
        }
    }
    Ok(())
}

/// The index of the config list item a patch item merges into: the first of `keys` the patch
/// item sets (not null, not empty) decides. With one key, unset matches unset (Talos compares
/// zero values).
fn find_keyed(items: &[Value], item: &Value, keys: &[&str]) -> Option<usize> {
    fn set(v: Option<&Value>) -> Option<&Value> {
        v.filter(|v| !v.is_null() && v.as_str() != Some(""))
    }
    if let [key] = keys {
        let want = set(item.get(*key));
        return items.iter().position(|it| match (set(it.get(*key)), want) {
            (Some(a), Some(b)) => same_key_value(a, b),
            (None, None) => true,
            _ => false,
        });
    }
    let (key, want) = keys
        .iter()
        .find_map(|k| set(item.get(*k)).map(|v| (*k, v)))?;
    items
        .iter()
        .position(|it| set(it.get(key)).is_some_and(|v| same_key_value(v, want)))
}

// ---------------------------------------------------------------------------------------------
// RFC 6902 JSON patches
// ---------------------------------------------------------------------------------------------

/// An RFC 6902 JSON patch: a list of operations on the single document of a config.
#[derive(Clone, Debug, PartialEq)]
pub struct JsonPatch {
    ops: Vec<JsonOp>,
}

/// One JSON patch operation (RFC 6902 section 4).
#[derive(Clone, Debug, PartialEq)]
pub enum JsonOp {
    /// `add` (section 4.1).
    Add {
        /// Target.
        path: Pointer,
        /// Value to add.
        value: Value,
    },
    /// `remove` (section 4.2).
    Remove {
        /// Target.
        path: Pointer,
    },
    /// `replace` (section 4.3).
    Replace {
        /// Target.
        path: Pointer,
        /// New value.
        value: Value,
    },
    /// `move` (section 4.4).
    Move {
        /// Source.
        from: Pointer,
        /// Target.
        path: Pointer,
    },
    /// `copy` (section 4.5).
    Copy {
        /// Source.
        from: Pointer,
        /// Target.
        path: Pointer,
    },
    /// `test` (section 4.6).
    Test {
        /// Target.
        path: Pointer,
        /// Expected value.
        value: Value,
    },
}

impl JsonOp {
    fn name(&self) -> &'static str {
        match self {
            JsonOp::Add { .. } => "add",
            JsonOp::Remove { .. } => "remove",
            JsonOp::Replace { .. } => "replace",
            JsonOp::Move { .. } => "move",
            JsonOp::Copy { .. } => "copy",
            JsonOp::Test { .. } => "test",
        }
    }

    fn path(&self) -> &Pointer {
        match self {
            JsonOp::Add { path, .. }
            | JsonOp::Remove { path }
            | JsonOp::Replace { path, .. }
            | JsonOp::Move { path, .. }
            | JsonOp::Copy { path, .. }
            | JsonOp::Test { path, .. } => path,
        }
    }
}

/// A JSON pointer (RFC 6901): reference tokens, unescaped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pointer(pub Vec<String>);

impl Pointer {
    /// Parse `/a/b~1c/0`.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Ok(Pointer(Vec::new()));
        }
        let Some(rest) = s.strip_prefix('/') else {
            return Err(format!("JSON pointer `{s}` must start with `/`"));
        };
        Ok(Pointer(
            rest.split('/')
                .map(|t| t.replace("~1", "/").replace("~0", "~"))
                .collect(),
        ))
    }
}

impl fmt::Display for Pointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(document root)");
        }
        let mut first = true;
        for t in &self.0 {
            if t.parse::<usize>().is_ok() || t == "-" {
                write!(f, "[{t}]")?;
            } else {
                if !first {
                    f.write_str(".")?;
                }
                f.write_str(t)?;
            }
            first = false;
        }
        Ok(())
    }
}

impl JsonPatch {
    /// Build from a list of operation mappings (`op`, `path`, `value`, `from`).
    pub fn from_operations(ops: &[Value]) -> Result<Self, PatchError> {
        let mut out = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            let bad = |reason: String| PatchError::BadOperation { index, reason };
            let Some(m) = op.as_mapping() else {
                return Err(bad(format!("expected a mapping, found {}", kind_name(op))));
            };
            let text = |k: &str| -> Result<String, PatchError> {
                match m.get(k) {
                    Some(Value::String(s)) => Ok(s.clone()),
                    Some(v) => Err(bad(format!("`{k}` must be a string, not {}", kind_name(v)))),
                    None => Err(bad(format!("`{k}` is missing"))),
                }
            };
            let pointer = |k: &str| -> Result<Pointer, PatchError> {
                Pointer::parse(&text(k)?).map_err(|e| bad(format!("`{k}`: {e}")))
            };
            let value = || -> Result<Value, PatchError> {
                m.get("value")
                    .cloned()
                    .ok_or_else(|| bad("`value` is missing".into()))
            };
            let op = match text("op")?.as_str() {
                "add" => JsonOp::Add {
                    path: pointer("path")?,
                    value: value()?,
                },
                "remove" => JsonOp::Remove {
                    path: pointer("path")?,
                },
                "replace" => JsonOp::Replace {
                    path: pointer("path")?,
                    value: value()?,
                },
                "move" => JsonOp::Move {
                    from: pointer("from")?,
                    path: pointer("path")?,
                },
                "copy" => JsonOp::Copy {
                    from: pointer("from")?,
                    path: pointer("path")?,
                },
                "test" => JsonOp::Test {
                    path: pointer("path")?,
                    value: value()?,
                },
                other => {
                    return Err(bad(format!(
                        "unknown op `{other}`: expected add, remove, replace, move, copy or test"
                    )))
                }
            };
            out.push(op);
        }
        Ok(JsonPatch { ops: out })
    }

    /// The operations, in order.
    pub fn operations(&self) -> &[JsonOp] {
        &self.ops
    }

    /// Apply to a config of exactly one document. Operations run in order; if one fails the
    /// document is left unchanged.
    pub fn apply_to(&self, config: &mut MachineConfig) -> Result<(), PatchError> {
        let n = config.documents().len();
        if n != 1 {
            return Err(PatchError::JsonPatchMultiDocument(n));
        }
        let mut doc = config.documents()[0].clone();
        for (index, op) in self.ops.iter().enumerate() {
            apply_op(&mut doc, op).map_err(|reason| PatchError::JsonPatchFailed {
                index,
                op: op.name(),
                path: op.path().to_string(),
                reason,
            })?;
        }
        normalise_document(&mut doc);
        config.documents_mut()[0] = doc;
        Ok(())
    }
}

fn apply_op(doc: &mut Value, op: &JsonOp) -> Result<(), String> {
    match op {
        JsonOp::Add { path, value } => add(doc, path, value.clone()),
        JsonOp::Remove { path } => remove(doc, path).map(|_| ()),
        JsonOp::Replace { path, value } => {
            let target = get_mut(doc, &path.0)?;
            *target = value.clone();
            Ok(())
        }
        JsonOp::Move { from, path } => {
            if path.0.len() > from.0.len() && path.0.starts_with(&from.0) {
                return Err(format!("cannot move {from} into one of its own children"));
            }
            let v = remove(doc, from)?;
            add(doc, path, v)
        }
        JsonOp::Copy { from, path } => {
            let v = get_mut(doc, &from.0)?.clone();
            add(doc, path, v)
        }
        JsonOp::Test { path, value } => {
            let v = get_mut(doc, &path.0)?;
            if v == value {
                Ok(())
            } else {
                Err("test failed: the value differs".into())
            }
        }
    }
}

fn map_key(m: &Mapping, token: &str) -> Option<Value> {
    m.keys()
        .find(|k| scalar_text(k).as_deref() == Some(token))
        .cloned()
}

fn array_index(token: &str, len: usize, allow_end: bool) -> Result<usize, String> {
    if allow_end && token == "-" {
        return Ok(len);
    }
    let valid = !token.is_empty()
        && token.chars().all(|c| c.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    let i: usize = if valid {
        token.parse().map_err(|_| format!("bad index `{token}`"))?
    } else {
        return Err(format!("`{token}` is not a list index"));
    };
    let max = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if i > max || (!allow_end && len == 0) {
        return Err(format!(
            "index {i} is out of range (the list has {len} items)"
        ));
    }
    Ok(i)
}

fn get_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Result<&'a mut Value, String> {
    let mut node = doc;
    for (depth, t) in tokens.iter().enumerate() {
        let here = Pointer(tokens[..depth].to_vec());
        node = match node {
            Value::Mapping(m) => {
                let k = map_key(m, t).ok_or_else(|| format!("`{t}` is missing under {here}"))?;
                m.get_mut(&k)
                    .ok_or_else(|| format!("`{t}` is missing under {here}"))?
            }
            Value::Sequence(s) => {
                let i = array_index(t, s.len(), false)?;
                &mut s[i]
            }
            other => {
                return Err(format!(
                    "{here} is {}, not a mapping or list",
                    kind_name(other)
                ))
            }
        };
    }
    Ok(node)
}

fn add(doc: &mut Value, path: &Pointer, value: Value) -> Result<(), String> {
    let Some((last, parents)) = path.0.split_last() else {
        *doc = value;
        return Ok(());
    };
    match get_mut(doc, parents)? {
        Value::Mapping(m) => {
            let k = map_key(m, last).unwrap_or_else(|| Value::String(last.clone()));
            m.insert(k, value);
            Ok(())
        }
        Value::Sequence(s) => {
            let i = array_index(last, s.len(), true)?;
            s.insert(i, value);
            Ok(())
        }
        other => Err(format!(
            "the parent is {}, not a mapping or list",
            kind_name(other)
        )),
    }
}

fn remove(doc: &mut Value, path: &Pointer) -> Result<Value, String> {
    let Some((last, parents)) = path.0.split_last() else {
        return Err("cannot remove the whole document".into());
    };
    match get_mut(doc, parents)? {
        Value::Mapping(m) => {
            let k = map_key(m, last).ok_or_else(|| format!("`{last}` is missing"))?;
            m.shift_remove(&k)
                .ok_or_else(|| format!("`{last}` is missing"))
        }
        Value::Sequence(s) => {
            let i = array_index(last, s.len(), false)?;
            Ok(s.remove(i))
        }
        other => Err(format!(
            "the parent is {}, not a mapping or list",
            kind_name(other)
        )),
    }
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

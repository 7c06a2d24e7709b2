//! Strategic merge patches: `$patch: delete` selectors and the typed merge of patch documents
//! into a [`MachineConfig`], following the table in [`super::rules`]. No I/O; imports nothing
//! outside `crate::talos`.

use serde_yaml_ng::{Mapping, Value};

use super::rules::{rule_for, MergeRule};
use super::PatchError;
use crate::talos::validate::shape::{is_value_struct, place_of, Place};
use crate::talos::{
    document_id_at, kind_name, normalise_document, path_text, scalar_text, DocumentId,
    MachineConfig, Seg,
};

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

    /// Whether a step of this patch merges or deletes at `keys` (or above or below) in
    /// `document`.
    pub fn touches(&self, document: &str, keys: &[String]) -> bool {
        self.steps.iter().any(|step| match step {
            Step::Delete(sel) => sel.doc.to_string() == document && super::on_path(&sel.keys, keys),
            Step::Merge { id, doc } => {
                if id.to_string() != document {
                    return false;
                }
                let mut node = doc;
                for k in keys {
                    match node {
                        Value::Mapping(m) => match m.get(k.as_str()) {
                            Some(v) => node = v,
                            None => return false,
                        },
                        // A list item may be the one: count it.
                        Value::Sequence(_) => return true,
                        _ => return false,
                    }
                }
                true
            }
        })
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

/// Run one `$patch: delete` the way Talos' delete selector does (`deleteForPath` in
/// `pkg/machinery/config/configloader/internal/decoder/selector.go`, the same from v1.11.6 to
/// v1.14.0-rc.1). Talos walks its Go types, so whether a missing key is an error depends on what
/// the place is ([`place_of`]): an unset struct field is zeroed (nothing to do), while a key a map
/// does not hold, a name that is no field, an unset pointer on the way, or a list item that is
/// not there is "lookup failed". Struct values (not pointers) on the way are walked into even when
/// unset ([`is_value_struct`]).
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
    // Walk to the parent; `None` once inside an unset struct value (an empty struct to Talos).
    let mut node = Some(&mut docs[pos]);
    for (i, k) in parent_keys.iter().enumerate() {
        node = match node {
            Some(n) => match n.get_mut(k.as_str()) {
                Some(v) if !v.is_null() => Some(v),
                _ if is_value_struct(&sel.doc, &parent_keys[..=i]) => None,
                _ => return Err(fail(format!("lookup failed: `{k}` is not set"))),
            },
            None if is_value_struct(&sel.doc, &parent_keys[..=i]) => None,
            None => return Err(fail(format!("lookup failed: `{k}` is not set"))),
        };
    }
    // A key the parent does not hold: Talos' verdict by what the place is.
    let absent = |key: &str| match place_of(&sel.doc, &sel.keys) {
        Place::MapKey => Err(fail(format!("lookup failed: the map has no key `{key}`"))),
        Place::NotAField => Err(fail(format!(
            "lookup failed: `{key}` is not a field Talos knows here"
        ))),
        // An unset struct field is zeroed: already deleted.
        Place::Field | Place::Unknown => Ok(()),
    };
    match (last, &sel.item, node) {
        (Some(key), _, None) => absent(key),
        (Some(key), _, Some(node)) => match node.as_mapping_mut() {
            Some(m) => match m.shift_remove(key.as_str()) {
                Some(_) => Ok(()),
                None => absent(key),
            },
            None => Err(fail(format!(
                "lookup failed: not a mapping but {}",
                kind_name(node)
            ))),
        },
        (None, Some(_), None) => Err(fail("lookup failed: no such list item".into())),
        (None, Some((key, value)), Some(node)) => {
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
        (None, None, _) => Ok(()),
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

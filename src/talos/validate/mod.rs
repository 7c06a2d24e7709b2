//! Validation of a rendered machine config before it is ever served: against the JSON schema of
//! its target Talos release ([`SchemaValidator`]; the schemas of the supported releases are
//! embedded in the binary from `talos-schemas/`, and a configured schema file may add or override
//! one), and against the rules Talos applies itself ([`check_semantics`]): a valid
//! `machine.type`, CA private keys only on control planes, an https control-plane endpoint, VIPs
//! only on control planes, an install disk or disk selector.
//!
//! Every [`Violation`] names its document and YAML path. Each document is checked against the
//! schema definition of its own kind (found by `apiVersion`/`kind`), so errors point at the
//! offending key instead of a top-level "matches none of oneOf". Where Talos' published schema
//! disagrees with Talos' own decoder (misspelled or missing kinds), the decoder wins
//! ([`DECODER_KINDS`]). This module reads only the schema file it is given and imports nothing
//! outside `crate::talos`.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_yaml_ng::Value;

pub mod cel;
mod correct;
mod kinds;
mod oci;
mod rules;
pub mod shape;
mod v1alpha1;
mod x509;

pub use rules::V1ALPHA1_RULES;

use super::disk::SizeBound;
use super::{kind_name, DocumentId, MachineConfig, TalosVersion};

/// Where a rule comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleSource {
    /// The Talos JSON schema of the target release.
    Schema,
    /// A check Talos itself performs when it loads the config.
    Talos,
    /// A stricter check of Plinth's (a worker never needs the key it forbids).
    Plinth,
}

/// Whether a finding stops the config from being served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// The config must not be served.
    Error,
    /// Talos accepts it, but the operator should know (e.g. a deprecated field).
    Warning,
}

/// One problem in a config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The document (`v1alpha1`, or `apiVersion/kind name`).
    pub document: String,
    /// YAML path in the document, e.g. `machine.install.diskSelector.size`.
    pub path: String,
    /// What is wrong and, where it helps, how to fix it.
    pub message: String,
    /// Which rule set says so.
    pub source: RuleSource,
    /// Error or warning.
    pub severity: Severity,
    /// The rule: the Talos source file whose validator says so (or the schema file), or
    /// `plinth` for a rule of Plinth's own.
    pub rule: &'static str,
}

/// The rule name of findings from Talos' JSON schema.
pub const SCHEMA_RULE: &str = "pkg/machinery/config/schemas/config.schema.json";

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.document, self.path, self.message)
    }
}

/// The errors (and warnings) of an invalid config.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid machine config: {}", .errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ValidationReport {
    /// What stops the config from being served.
    pub errors: Vec<Violation>,
    /// What the operator should know besides.
    pub warnings: Vec<Violation>,
}

/// The shape of the v1alpha1 document as some schema describes it: which keys a mapping may hold,
/// whether it is a map of free keys, what a list holds.
#[derive(Debug, Default)]
struct FieldTree {
    keys: HashMap<String, FieldTree>,
    /// A mapping of free keys (`additionalProperties`/`patternProperties` with a schema).
    any_key: Option<Box<FieldTree>>,
    items: Option<Box<FieldTree>>,
}

impl FieldTree {
    fn from_def(root: &serde_json::Value, node: &serde_json::Value, depth: usize) -> FieldTree {
        let mut tree = FieldTree::default();
        if depth > 16 {
            return tree;
        }
        let node = match node
            .get("$ref")
            .and_then(|r| r.as_str())
            .and_then(|r| r.strip_prefix("#/$defs/"))
        {
            Some(name) => match root.get("$defs").and_then(|d| d.get(name)) {
                Some(def) => def,
                None => return tree,
            },
            None => node,
        };
        if let Some(props) = node.get("properties").and_then(|p| p.as_object()) {
            for (k, v) in props {
                tree.keys
                    .insert(k.clone(), FieldTree::from_def(root, v, depth + 1));
            }
        }
        let free = node
            .get("additionalProperties")
            .filter(|v| v.is_object())
            .or_else(|| {
                node.get("patternProperties")
                    .and_then(|p| p.as_object())
                    .and_then(|p| p.values().next())
            });
        if let Some(v) = free {
            tree.any_key = Some(Box::new(FieldTree::from_def(root, v, depth + 1)));
        }
        if let Some(v) = node.get("items") {
            tree.items = Some(Box::new(FieldTree::from_def(root, v, depth + 1)));
        }
        tree
    }

    /// Whether this shape has a place at `tokens` (JSON pointer tokens).
    fn knows(&self, tokens: &[String]) -> bool {
        let Some((first, rest)) = tokens.split_first() else {
            return true;
        };
        if first.parse::<usize>().is_ok() {
            if let Some(items) = &self.items {
                return items.knows(rest);
            }
        }
        if self.keys.is_empty() && self.any_key.is_none() && self.items.is_none() {
            // A leaf, or an object of free form (e.g. `extraConfig`).
            return true;
        }
        match (self.keys.get(first), &self.any_key) {
            (Some(t), _) => t.knows(rest),
            (None, Some(t)) => t.knows(rest),
            (None, None) => false,
        }
    }
}

/// The v1alpha1 shapes of the embedded schemas, by minor release.
fn v1alpha1_trees() -> &'static [(u32, FieldTree)] {
    static TREES: OnceLock<Vec<(u32, FieldTree)>> = OnceLock::new();
    TREES.get_or_init(|| {
        EMBEDDED_SCHEMAS
            .iter()
            .filter_map(|(_, minor, _, text)| {
                let mut schema: serde_json::Value = serde_json::from_str(text).ok()?;
                correct::correct_schema(&mut schema);
                let def = schema.get("$defs")?.get("v1alpha1.Config")?;
                Some((*minor, FieldTree::from_def(&schema, def, 0)))
            })
            .collect()
    })
}

/// Whether a v1alpha1 field that the schema of `version` does not list is one Talos still
/// decodes. Talos hides deprecated fields from its docs and schema (`docgen:nodoc` in
/// `pkg/machinery/config/types/v1alpha1/v1alpha1_types.go`) but keeps them in the struct it
/// decodes into, and that struct only grew from 1.11 to 1.14: so a field an earlier release's
/// schema documents is still accepted. Talos' verdict on such a field is "accepted", silently
/// (the few it warns about are rules of [`check_semantics`]).
fn hidden_v1alpha1_field(version: TalosVersion, tokens: &[String]) -> bool {
    let under = |prefix: &str| {
        let parts: Vec<&str> = prefix.split('.').collect();
        parts.len() <= tokens.len()
            && parts
                .iter()
                .zip(tokens)
                .all(|(p, t)| *p == t.as_str() || (*p == "[]" && t.parse::<usize>().is_ok()))
    };
    version.major == 1
        && (HIDDEN_SINCE_1_11.iter().any(|p| under(p))
            || v1alpha1_trees()
                .iter()
                .any(|(minor, tree)| *minor <= version.minor && tree.knows(tokens)))
}

/// The v1alpha1 validators of the embedded schemas, by minor release, compiled once.
fn v1alpha1_validators() -> &'static [(u32, jsonschema::Validator)] {
    static VALIDATORS: OnceLock<Vec<(u32, jsonschema::Validator)>> = OnceLock::new();
    VALIDATORS.get_or_init(|| {
        EMBEDDED_SCHEMAS
            .iter()
            .filter_map(|(_, minor, _, text)| {
                let mut schema: serde_json::Value = serde_json::from_str(text).ok()?;
                correct::correct_schema(&mut schema);
                let obj = schema.as_object_mut()?;
                obj.remove("oneOf");
                obj.insert(
                    "$ref".into(),
                    serde_json::Value::String("#/$defs/v1alpha1.Config".into()),
                );
                Some((*minor, jsonschema::validator_for(&schema).ok()?))
            })
            .collect()
    })
}

/// Type errors in the values of hidden v1alpha1 fields (at `hidden`), as the newest embedded
/// schema of the same or an earlier release that documents each field sees them. Unknown keys
/// are left to [`unknown_under`].
fn hidden_value_errors(
    version: TalosVersion,
    doc: &serde_json::Value,
    hidden: &[Vec<String>],
) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    if hidden.is_empty() || version.major != 1 {
        return out;
    }
    let trees = v1alpha1_trees();
    for (minor, validator) in v1alpha1_validators().iter().rev() {
        if *minor > version.minor {
            continue;
        }
        let Some((_, tree)) = trees.iter().find(|(m, _)| m == minor) else {
            continue;
        };
        let mine: Vec<&Vec<String>> = hidden
            .iter()
            .filter(|h| tree.knows(h))
            .filter(|h| {
                // Only the newest schema that knows a field speaks for it.
                !trees.iter().any(|(m, t)| {
                    *m > *minor && *m <= version.minor && t.knows(h) && *m != version.minor
                })
            })
            .collect();
        if mine.is_empty() {
            continue;
        }
        for e in validator.iter_errors(doc) {
            if matches!(
                e.kind(),
                jsonschema::error::ValidationErrorKind::AdditionalProperties { .. }
            ) {
                continue;
            }
            let tokens = pointer_tokens(e.instance_path().as_str());
            if mine.iter().any(|h| tokens.starts_with(h)) {
                out.push((
                    tokens,
                    format!("{e} (field hidden from the Talos {version} docs)"),
                ));
            }
        }
    }
    out
}

/// The places under a hidden field (at `tokens`, holding `value`) that Talos does not decode.
fn unknown_under(
    version: TalosVersion,
    tokens: &mut Vec<String>,
    value: &serde_json::Value,
    out: &mut Vec<Vec<String>>,
) {
    let children: Vec<(String, &serde_json::Value)> = match value {
        serde_json::Value::Object(m) => m.iter().map(|(k, v)| (k.clone(), v)).collect(),
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, v)| (i.to_string(), v))
            .collect(),
        _ => return,
    };
    for (k, v) in children {
        tokens.push(k);
        if hidden_v1alpha1_field(version, tokens) {
            unknown_under(version, tokens, v, out);
        } else {
            out.push(tokens.clone());
        }
        tokens.pop();
    }
}

/// `["machine", "interfaces", "0", "mtu"]` -> `machine.interfaces[0].mtu`.
fn tokens_to_path(tokens: &[String]) -> String {
    let mut s = String::new();
    for t in tokens {
        if t.parse::<usize>().is_ok() {
            s.push_str(&format!("[{t}]"));
        } else {
            if !s.is_empty() {
                s.push('.');
            }
            s.push_str(t);
        }
    }
    if s.is_empty() {
        s.push_str("(document root)");
    }
    s
}

/// v1alpha1 fields that no embedded schema documents but that Talos 1.11 to 1.14 decode: the
/// fields tagged `docgen:nodoc` in `pkg/machinery/config/types/v1alpha1/v1alpha1_types.go` at
/// v1.11.6 (whole subtrees). `talosctl gen config` itself still writes `persist: true`.
const HIDDEN_SINCE_1_11: &[&str] = &[
    "persist",
    "machine.disks",
    "machine.systemDiskEncryption",
    "machine.install.extensions",
    "machine.install.bootloader",
    "machine.network.interfaces.[].cidr",
    "machine.network.interfaces.[].vlans.[].cidr",
    "cluster.allowSchedulingOnMasters",
    "cluster.etcd.subnet",
];

/// The Talos JSON schemas embedded in the binary: (major, minor, the release tag the file was
/// taken from, the schema text). The files are `pkg/machinery/config/schemas/config.schema.json`
/// of siderolabs/talos at those tags (MPL-2.0; see `talos-schemas/NOTICE`).
const EMBEDDED_SCHEMAS: &[(u32, u32, &str, &str)] = &[
    (
        1,
        11,
        "v1.11.6",
        include_str!("../../../talos-schemas/v1.11.json"),
    ),
    (
        1,
        12,
        "v1.12.11",
        include_str!("../../../talos-schemas/v1.12.json"),
    ),
    (
        1,
        13,
        "v1.13.9",
        include_str!("../../../talos-schemas/v1.13.json"),
    ),
    (
        1,
        14,
        "v1.14.0-rc.1",
        include_str!("../../../talos-schemas/v1.14.json"),
    ),
];

/// The Talos minor releases whose schema ships in the binary, with the tag it was taken from.
pub fn embedded_schema_versions() -> impl Iterator<Item = (TalosVersion, &'static str)> {
    EMBEDDED_SCHEMAS
        .iter()
        .map(|(major, minor, tag, _)| (TalosVersion::new(*major, *minor, 0), *tag))
}

/// How a kind that Talos' decoder accepts is found in Talos' published schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaEntry {
    /// The schema spells the kind differently; check the document against that definition.
    SpelledAs(&'static str),
    /// The schema has no definition: only the document's own rules apply.
    Missing,
}

/// Document kinds Talos' decoder registers (`registry.Register` in
/// `pkg/machinery/config/types/*/`) that its published `config.schema.json` misspells or lacks:
/// (apiVersion, kind, first minor release, entry). The decoder decides what Talos accepts, so
/// these kinds are accepted and, where the schema has them under another name, checked against
/// that definition. Found by comparing each release's registry with its schema's `oneOf`.
pub const DECODER_KINDS: &[(&str, &str, u32, SchemaEntry)] = &[
    // pkg/machinery/config/types/network/kubespan_endpoints.go registers
    // `KubeSpanEndpointsConfig`; the schema's enum says `KubeSpanEndpoints` (1.11 to 1.14).
    (
        "v1alpha1",
        "KubeSpanEndpointsConfig",
        11,
        SchemaEntry::SpelledAs("KubeSpanEndpoints"),
    ),
    // pkg/machinery/config/types/security/image_verification.go (1.13+) is in no schema.
    (
        "v1alpha1",
        "ImageVerificationConfig",
        13,
        SchemaEntry::Missing,
    ),
    // pkg/machinery/config/types/runtime/unattended_install.go registers
    // `UnattendedInstallConfig`; the 1.14 schema's enum says `UnattendedInstall`.
    (
        "v1alpha1",
        "UnattendedInstallConfig",
        14,
        SchemaEntry::SpelledAs("UnattendedInstall"),
    ),
];

/// Why validation could not run, or found problems.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// The schema file could not be read.
    #[error("cannot read Talos schema {path}: {source}")]
    ReadSchema {
        /// The file.
        path: PathBuf,
        /// I/O error.
        source: std::io::Error,
    },
    /// The schema file is not JSON.
    #[error("Talos schema {path} is not JSON: {source}")]
    SchemaJson {
        /// The file.
        path: PathBuf,
        /// Parser error.
        source: serde_json::Error,
    },
    /// The schema is for another Talos release.
    #[error("Talos schema {path} has $id `{id}`, which is not the schema of Talos {version}; configure the schema file of the cluster's Talos version")]
    WrongVersion {
        /// The file.
        path: PathBuf,
        /// Its `$id`.
        id: String,
        /// The release asked for.
        version: TalosVersion,
    },
    /// No schema of this release ships with Plinth and none was configured.
    #[error("no Talos schema for {version}: Plinth ships the schemas of Talos {supported}; for another release put its config.schema.json in the directory named by [talos] schema_dir (or pass --schema)")]
    NoSchema {
        /// The release asked for.
        version: TalosVersion,
        /// The releases whose schemas are embedded.
        supported: String,
    },
    /// The config has problems.
    #[error(transparent)]
    Invalid(#[from] ValidationReport),
}

/// The JSON schema of one Talos release, ready to check configs.
pub struct SchemaValidator {
    version: TalosVersion,
    schema: serde_json::Value,
    /// (apiVersion, kind) -> `$defs` name; the v1alpha1 document is ("", "v1alpha1").
    kinds: HashMap<(String, String), String>,
    /// Kinds whose schema definition spells `kind` differently: (apiVersion, kind) -> the
    /// spelling the definition's enum wants.
    respelled: HashMap<(String, String), String>,
    /// Kinds Talos decodes that the schema does not define: only their own rules apply.
    unchecked: Vec<(String, String)>,
    compiled: HashMap<String, OnceLock<Result<jsonschema::Validator, String>>>,
}

impl fmt::Debug for SchemaValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchemaValidator")
            .field("version", &self.version)
            .field("kinds", &self.kinds.len())
            .finish()
    }
}

impl SchemaValidator {
    /// Load `config.schema.json` of Talos `version` from `path`. The schema's `$id` must name the
    /// same major.minor release.
    pub fn load(path: &Path, version: TalosVersion) -> Result<Self, ValidateError> {
        let text = std::fs::read_to_string(path).map_err(|source| ValidateError::ReadSchema {
            path: path.to_path_buf(),
            source,
        })?;
        let schema: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| ValidateError::SchemaJson {
                path: path.to_path_buf(),
                source,
            })?;
        let id = schema
            .get("$id")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        let want = format!("/v{}.{}/", version.major, version.minor);
        if !id.contains(&want) {
            return Err(ValidateError::WrongVersion {
                path: path.to_path_buf(),
                id,
                version,
            });
        }
        Ok(Self::from_schema(schema, version))
    }

    /// The schema of `version` embedded in the binary.
    pub fn embedded(version: TalosVersion) -> Result<Self, ValidateError> {
        let Some((_, _, tag, text)) = EMBEDDED_SCHEMAS
            .iter()
            .find(|(major, minor, _, _)| *major == version.major && *minor == version.minor)
        else {
            return Err(ValidateError::NoSchema {
                version,
                supported: embedded_schema_versions()
                    .map(|(v, _)| format!("{}.{}", v.major, v.minor))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let schema: serde_json::Value =
            serde_json::from_str(text).map_err(|source| ValidateError::SchemaJson {
                path: PathBuf::from(format!("(embedded schema of Talos {tag})")),
                source,
            })?;
        Ok(Self::from_schema(schema, version))
    }

    /// Use an already parsed schema (no version check). Where the schema disagrees with Talos'
    /// decoder it is corrected first (`correct.rs`).
    pub fn from_schema(mut schema: serde_json::Value, version: TalosVersion) -> Self {
        correct::correct_schema(&mut schema);
        let mut kinds = HashMap::new();
        let refs = schema
            .get("oneOf")
            .and_then(|v| v.as_array())
            .cloned()
            .unwrap_or_default();
        for r in refs {
            let Some(name) = r
                .get("$ref")
                .and_then(|v| v.as_str())
                .and_then(|s| s.strip_prefix("#/$defs/"))
            else {
                continue;
            };
            let Some(def) = schema.get("$defs").and_then(|d| d.get(name)) else {
                continue;
            };
            let first_enum = |prop: &str| -> Option<String> {
                def.get("properties")?
                    .get(prop)?
                    .get("enum")?
                    .get(0)?
                    .as_str()
                    .map(str::to_string)
            };
            let key = match (first_enum("apiVersion"), first_enum("kind")) {
                (Some(a), Some(k)) => (a, k),
                _ if first_enum("version").is_some() => {
                    (String::new(), super::V1ALPHA1.to_string())
                }
                _ => continue,
            };
            kinds.insert(key, name.to_string());
        }
        let mut respelled = HashMap::new();
        let mut unchecked = Vec::new();
        for (api, kind, first_minor, entry) in DECODER_KINDS {
            if version.major != 1 || version.minor < *first_minor {
                continue;
            }
            let key = (api.to_string(), kind.to_string());
            if kinds.contains_key(&key) {
                continue;
            }
            match entry {
                SchemaEntry::SpelledAs(spelling) => {
                    // The misspelled kind is not one Talos decodes: it leaves the table.
                    if let Some(def) = kinds.remove(&(api.to_string(), spelling.to_string())) {
                        kinds.insert(key.clone(), def);
                        respelled.insert(key, spelling.to_string());
                    } else {
                        unchecked.push(key);
                    }
                }
                SchemaEntry::Missing => unchecked.push(key),
            }
        }
        let compiled = kinds
            .values()
            .map(|n| (n.clone(), OnceLock::new()))
            .collect();
        SchemaValidator {
            version,
            schema,
            kinds,
            respelled,
            unchecked,
            compiled,
        }
    }

    /// The release this schema belongs to.
    pub fn version(&self) -> TalosVersion {
        self.version
    }

    fn validator(&self, def: &str) -> Result<&jsonschema::Validator, String> {
        let cell = self
            .compiled
            .get(def)
            .ok_or_else(|| format!("no schema definition `{def}`"))?;
        cell.get_or_init(|| {
            let mut s = self.schema.clone();
            if let Some(obj) = s.as_object_mut() {
                obj.remove("oneOf");
                obj.insert(
                    "$ref".into(),
                    serde_json::Value::String(format!("#/$defs/{def}")),
                );
            }
            jsonschema::validator_for(&s).map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// Check every document against the schema definition of its kind.
    pub fn check(&self, config: &MachineConfig) -> Vec<Violation> {
        let mut out = Vec::new();
        for doc in config.documents() {
            let id = DocumentId::of(doc).unwrap_or_else(DocumentId::v1alpha1);
            let document = id.to_string();
            let v = |path: &str, message: String| Violation {
                document: document.clone(),
                path: path.to_string(),
                message,
                source: RuleSource::Schema,
                severity: Severity::Error,
                rule: SCHEMA_RULE,
            };
            let key = (id.api_version.clone(), id.kind.clone());
            if self.unchecked.contains(&key) {
                continue;
            }
            let Some(def) = self.kinds.get(&key) else {
                out.push(v(
                    "kind",
                    format!(
                        "`{}/{}` is not a config document of Talos {}",
                        id.api_version, id.kind, self.version
                    ),
                ));
                continue;
            };
            let json = match serde_json::to_value(doc) {
                Ok(mut j) => {
                    if let (Some(spelling), Some(obj)) =
                        (self.respelled.get(&key), j.as_object_mut())
                    {
                        obj.insert("kind".into(), serde_json::Value::String(spelling.clone()));
                    }
                    j
                }
                Err(e) => {
                    out.push(v(
                        "(document root)",
                        format!("not expressible as JSON: {e}"),
                    ));
                    continue;
                }
            };
            match self.validator(def) {
                Ok(validator) => {
                    let mut hidden_seen: Vec<Vec<String>> = Vec::new();
                    for e in validator.iter_errors(&json) {
                        let path = pointer_to_path(e.instance_path().as_str());
                        let unexpected = match e.kind() {
                            jsonschema::error::ValidationErrorKind::AdditionalProperties {
                                unexpected,
                            } if id.is_v1alpha1() => unexpected.clone(),
                            _ => {
                                let value = json.pointer(e.instance_path().as_str());
                                if !(id.is_v1alpha1() && decoder_accepts(&path, value)) {
                                    out.push(v(&path, enum_message(&e, value)));
                                }
                                continue;
                            }
                        };
                        let at: Vec<String> = pointer_tokens(e.instance_path().as_str());
                        for key in unexpected {
                            let mut tokens = at.clone();
                            tokens.push(key.clone());
                            let mut unknown = Vec::new();
                            if hidden_v1alpha1_field(self.version, &tokens) {
                                hidden_seen.push(tokens.clone());
                                // Hidden, but its own fields must still be ones Talos decodes.
                                let value = json.pointer(&format!(
                                    "{}/{}",
                                    e.instance_path().as_str(),
                                    key.replace('~', "~0").replace('/', "~1")
                                ));
                                if let Some(value) = value {
                                    unknown_under(self.version, &mut tokens, value, &mut unknown);
                                }
                            } else {
                                unknown.push(tokens);
                            }
                            for tokens in unknown {
                                let full = tokens_to_path(&tokens);
                                let field = tokens.last().cloned().unwrap_or_default();
                                out.push(v(
                                    &full,
                                    format!(
                                        "unknown field `{field}` (Talos {} does not decode it)",
                                        self.version
                                    ),
                                ));
                            }
                        }
                    }
                    // Values under hidden fields are still typed: check them against the
                    // newest earlier schema that documents them.
                    for (tokens, message) in hidden_value_errors(self.version, &json, &hidden_seen)
                    {
                        out.push(v(&tokens_to_path(&tokens), message));
                    }
                }
                Err(e) => out.push(v(
                    "(document root)",
                    format!("the schema definition `{def}` does not compile: {e}"),
                )),
            }
        }
        out
    }
}

/// The message of a schema error; for an enum that [`correct::correct_schema`] made
/// case-insensitive, it names the values again instead of the pattern.
fn enum_message(e: &jsonschema::ValidationError<'_>, value: Option<&serde_json::Value>) -> String {
    if let jsonschema::error::ValidationErrorKind::Pattern { pattern } = e.kind() {
        if let Some(names) = correct::folded_names(pattern) {
            return format!(
                "{} is not one of {names:?} (in any capitalisation, as Talos' decoder reads it)",
                value.map(ToString::to_string).unwrap_or_default()
            );
        }
    }
    e.to_string()
}

/// v1alpha1 values Talos' decoder takes that the schema's enums leave out: `machine.type`
/// `init`, `join` and empty (`ParseType` in `pkg/machinery/config/machine/machine.go`; the
/// schema lists only `controlplane` and `worker`). The v1alpha1 rules warn about `join` and
/// empty.
fn decoder_accepts(path: &str, value: Option<&serde_json::Value>) -> bool {
    path == "machine.type"
        && value
            .and_then(serde_json::Value::as_str)
            .is_some_and(|t| matches!(t, "init" | "join" | ""))
}

/// `/machine/a~1b/0` -> `["machine", "a/b", "0"]` (RFC 6901 unescaping).
fn pointer_tokens(p: &str) -> Vec<String> {
    p.split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect()
}

/// `/machine/network/interfaces/0/mtu` -> `machine.network.interfaces[0].mtu`.
fn pointer_to_path(p: &str) -> String {
    tokens_to_path(&pointer_tokens(p))
}

/// Check a config against the schema and Talos' own rules. `Ok` carries the warnings; `Err`
/// lists every error (and the warnings).
pub fn validate(
    config: &MachineConfig,
    schema: &SchemaValidator,
) -> Result<Vec<Violation>, ValidationReport> {
    let mut all = schema.check(config);
    all.extend(check_semantics(config, schema.version()));
    let (errors, warnings): (Vec<Violation>, Vec<Violation>) =
        all.into_iter().partition(|v| v.severity == Severity::Error);
    if errors.is_empty() {
        Ok(warnings)
    } else {
        Err(ValidationReport { errors, warnings })
    }
}

/// [`validate`] against the schema of `version` embedded in the binary.
pub fn validate_embedded(
    config: &MachineConfig,
    version: TalosVersion,
) -> Result<Vec<Violation>, ValidateError> {
    let schema = SchemaValidator::embedded(version)?;
    validate(config, &schema).map_err(ValidateError::Invalid)
}

/// Load the schema of `version` from `schema_path` and [`validate`] against it.
pub fn validate_with_schema_file(
    config: &MachineConfig,
    schema_path: &Path,
    version: TalosVersion,
) -> Result<Vec<Violation>, ValidateError> {
    let schema = SchemaValidator::load(schema_path, version)?;
    validate(config, &schema).map_err(ValidateError::Invalid)
}

fn text<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(v, path).and_then(Value::as_str)
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut node = v;
    for k in path {
        node = node.get(*k)?;
    }
    (!node.is_null()).then_some(node)
}

fn non_empty(v: &Value, path: &[&str]) -> bool {
    match at(v, path) {
        None => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Sequence(s)) => !s.is_empty(),
        Some(Value::Mapping(m)) => !m.is_empty(),
        Some(_) => true,
    }
}

/// The rules Talos applies when it loads a config (and a few stricter ones of Plinth's), for the
/// v1alpha1 document and the install document of `version`.
pub fn check_semantics(config: &MachineConfig, version: TalosVersion) -> Vec<Violation> {
    let mut out = Vec::new();
    let Some(doc) = config.v1alpha1() else {
        out.push(Violation {
            document: "v1alpha1".into(),
            path: "(document root)".into(),
            message: "the config has no v1alpha1 document (machine and cluster sections)".into(),
            source: RuleSource::Talos,
            severity: Severity::Error,
            rule: V1ALPHA1_RULES,
        });
        rules::check_documents(config, &mut out);
        kinds::check(config, version, &mut out);
        kinds::check_container(config, version, &mut out);
        return out;
    };
    let mut push = |path: &str, message: String, source: RuleSource| {
        out.push(Violation {
            document: "v1alpha1".into(),
            path: path.to_string(),
            message,
            source,
            severity: Severity::Error,
            rule: match source {
                RuleSource::Plinth => "plinth",
                RuleSource::Schema => SCHEMA_RULE,
                RuleSource::Talos => V1ALPHA1_RULES,
            },
        })
    };
    if at(doc, &["machine"]).is_none() {
        push(
            "machine",
            "machine instructions are required".into(),
            RuleSource::Talos,
        );
    }

    let machine_type = text(doc, &["machine", "type"]).unwrap_or("");
    let mut type_warning = None;
    let control_plane = match machine_type {
        "controlplane" | "init" => Some(true),
        "worker" => Some(false),
        // Talos' decoder reads `join` and an empty type as a worker, and warns
        // (pkg/machinery/config/machine/machine.go, ParseType).
        "join" | "" => {
            type_warning = Some(format!(
                "use \"worker\" instead of {machine_type:?} for machine type"
            ));
            Some(false)
        }
        other => {
            push(
                "machine.type",
                format!("unknown machine type {other:?}: expected controlplane or worker"),
                RuleSource::Talos,
            );
            None
        }
    };

    // Talos API CA.
    let has_ca = at(doc, &["machine", "ca"]).is_some();
    let accepted = non_empty(doc, &["machine", "acceptedCAs"]);
    if !has_ca && !accepted {
        push(
            "machine.ca",
            "issuing CA or some accepted CAs are required (machine.ca, machine.acceptedCAs)".into(),
            RuleSource::Talos,
        );
    }
    match control_plane {
        Some(true) if has_ca && !non_empty(doc, &["machine", "ca", "key"]) => push(
            "machine.ca.key",
            "issuing CA key is required for controlplane nodes".into(),
            RuleSource::Talos,
        ),
        Some(true) => {}
        Some(false) => {
            let worker_key = |path: &[&str], source: RuleSource, what: &str| {
                non_empty(doc, path).then(|| (path.join("."), source, what.to_string()))
            };
            let forbidden = [
                worker_key(
                    &["machine", "ca", "key"],
                    RuleSource::Talos,
                    "issuing Talos API CA key",
                ),
                worker_key(
                    &["cluster", "ca", "key"],
                    RuleSource::Talos,
                    "Kubernetes CA key",
                ),
                worker_key(
                    &["cluster", "aggregatorCA", "key"],
                    RuleSource::Plinth,
                    "aggregator CA key",
                ),
                worker_key(
                    &["cluster", "serviceAccount", "key"],
                    RuleSource::Plinth,
                    "service-account signing key",
                ),
                worker_key(
                    &["cluster", "etcd", "ca", "key"],
                    RuleSource::Plinth,
                    "etcd CA key",
                ),
            ];
            for (path, source, what) in forbidden.into_iter().flatten() {
                push(
                    &path,
                    format!("{what} is not allowed on non-controlplane nodes: render workers from the worker base config"),
                    source,
                );
            }
            if has_ca && !non_empty(doc, &["machine", "ca", "crt"]) && !accepted {
                push(
                    "machine.ca.crt",
                    "trusted CA certificates are required on non-controlplane nodes (machine.ca.crt, machine.acceptedCAs)".into(),
                    RuleSource::Talos,
                );
            }
            if at(doc, &["cluster", "etcd"]).is_some() {
                push(
                    "cluster.etcd",
                    "etcd config is only allowed on control plane machines".into(),
                    RuleSource::Talos,
                );
            }
            check_worker_vips(config, doc, &mut push);
        }
        None => {}
    }

    // Control-plane endpoint.
    if at(doc, &["cluster"]).is_none() {
        push(
            "cluster",
            "cluster instructions are required".into(),
            RuleSource::Talos,
        );
    } else if at(doc, &["cluster", "controlPlane"]).is_some() {
        match text(doc, &["cluster", "controlPlane", "endpoint"]) {
            None | Some("") => push(
                "cluster.controlPlane.endpoint",
                "cluster controlplane endpoint is required".into(),
                RuleSource::Talos,
            ),
            Some(ep) => {
                if let Err(why) = check_endpoint(ep) {
                    push(
                        "cluster.controlPlane.endpoint",
                        format!("invalid controlplane endpoint {ep:?}: {why}"),
                        RuleSource::Talos,
                    );
                }
            }
        }
    }

    check_install(config, doc, version, &mut push);
    if let Some(message) = type_warning {
        out.push(Violation {
            document: "v1alpha1".into(),
            path: "machine.type".into(),
            message,
            source: RuleSource::Talos,
            severity: Severity::Warning,
            rule: V1ALPHA1_RULES,
        });
    }
    rules::check_v1alpha1(doc, control_plane, version, &mut out);
    rules::check_documents(config, &mut out);
    kinds::check(config, version, &mut out);
    kinds::check_container(config, version, &mut out);
    out
}

fn check_worker_vips(
    config: &MachineConfig,
    doc: &Value,
    push: &mut impl FnMut(&str, String, RuleSource),
) {
    let msg = || "virtual (shared) IP is not allowed on non-controlplane nodes".to_string();
    if let Some(ifaces) =
        at(doc, &["machine", "network", "interfaces"]).and_then(Value::as_sequence)
    {
        for (i, iface) in ifaces.iter().enumerate() {
            if at(iface, &["vip"]).is_some() {
                push(
                    &format!("machine.network.interfaces[{i}].vip"),
                    msg(),
                    RuleSource::Talos,
                );
            }
            if let Some(vlans) = at(iface, &["vlans"]).and_then(Value::as_sequence) {
                for (j, vlan) in vlans.iter().enumerate() {
                    if at(vlan, &["vip"]).is_some() {
                        push(
                            &format!("machine.network.interfaces[{i}].vlans[{j}].vip"),
                            msg(),
                            RuleSource::Talos,
                        );
                    }
                }
            }
        }
    }
    for d in config.documents() {
        if let Some(id) = DocumentId::of(d) {
            if matches!(id.kind.as_str(), "Layer2VIPConfig" | "HCloudVIPConfig") {
                push(
                    &format!("(document {id})"),
                    format!("{} on a worker", msg()),
                    RuleSource::Plinth,
                );
            }
        }
    }
}

/// An https URL with a host and an optional port, as Talos requires of the cluster endpoint.
fn check_endpoint(ep: &str) -> Result<(), String> {
    let rest = ep
        .strip_prefix("https://")
        .ok_or("must be an https:// URL, e.g. https://10.0.0.10:6443")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err("must not carry credentials".into());
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or("unclosed IPv6 bracket")?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err("has no host".into());
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => {}
            _ => return Err(format!("port {p:?} is not 1-65535")),
        }
    }
    Ok(())
}

fn check_install(
    config: &MachineConfig,
    doc: &Value,
    version: TalosVersion,
    push: &mut impl FnMut(&str, String, RuleSource),
) {
    let unattended = config
        .documents()
        .iter()
        .find(|d| DocumentId::of(d).is_some_and(|id| id.kind == "UnattendedInstallConfig"));
    let install = at(doc, &["machine", "install"]);
    if unattended.is_some() {
        if !version.uses_unattended_install() {
            push(
                "(document UnattendedInstallConfig)",
                format!("Talos {version} does not know the UnattendedInstallConfig document; use machine.install"),
                RuleSource::Talos,
            );
        }
        if install.is_some() {
            push(
                "machine.install",
                "UnattendedInstallConfig config is incompatible with v1alpha1 config (.machine.install)"
                    .into(),
                RuleSource::Talos,
            );
        }
        return;
    }
    let Some(install) = install else {
        let hint = if version.uses_unattended_install() {
            "an UnattendedInstallConfig document (or machine.install)"
        } else {
            "machine.install with disk or diskSelector"
        };
        // Talos 1.14 no longer requires an install section (machine.install is deprecated in
        // favour of UnattendedInstallConfig, and neither is mandatory); Plinth still does, since
        // a bare-metal config it serves must say where to install.
        let source = if version.uses_unattended_install() {
            RuleSource::Plinth
        } else {
            RuleSource::Talos
        };
        push(
            "machine.install",
            format!("install instructions are required to install on bare metal: add {hint}"),
            source,
        );
        return;
    };
    let selector = at(install, &["diskSelector"]);
    if !non_empty(install, &["disk"]) && selector.is_none_or(|s| !non_empty(s, &[])) {
        push(
            "machine.install",
            "either install disk or diskSelector should be defined".into(),
            RuleSource::Talos,
        );
    }
    if let Some(sel) = selector {
        let Some(m) = sel.as_mapping() else {
            push(
                "machine.install.diskSelector",
                format!("must be a mapping, not {}", kind_name(sel)),
                RuleSource::Talos,
            );
            return;
        };
        if m.contains_key("name") {
            push(
                "machine.install.diskSelector.name",
                "install disk selector is invalid: selector on name is not supported".into(),
                RuleSource::Talos,
            );
        }
        if let Some(size) = m.get("size") {
            let ok = super::scalar_text(size).map(|s| s.parse::<SizeBound>());
            match ok {
                Some(Ok(_)) => {}
                Some(Err(e)) => push(
                    "machine.install.diskSelector.size",
                    e.to_string(),
                    RuleSource::Talos,
                ),
                None => push(
                    "machine.install.diskSelector.size",
                    "must be a size condition such as `>= 400GB`".into(),
                    RuleSource::Talos,
                ),
            }
        }
        if let Some(t) = m.get("type") {
            let t = super::scalar_text(t).unwrap_or_default();
            if !matches!(t.as_str(), "ssd" | "hdd" | "nvme" | "sd") {
                push(
                    "machine.install.diskSelector.type",
                    format!("unsupported disk type {t:?}: expected ssd, hdd, nvme or sd"),
                    RuleSource::Talos,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> MachineConfig {
        MachineConfig::parse(text).expect("config")
    }

    const V113: TalosVersion = TalosVersion::new(1, 13, 0);

    const WORKER: &str = "version: v1alpha1\nmachine:\n  type: worker\n  ca: {crt: Y3J0}\n  install: {disk: /dev/sda}\ncluster:\n  controlPlane: {endpoint: 'https://10.0.0.1:6443'}\n  ca: {crt: Y3J0}\n";

    fn paths(v: &[Violation]) -> Vec<&str> {
        v.iter().map(|v| v.path.as_str()).collect()
    }

    #[test]
    fn a_clean_worker_passes() {
        assert_eq!(check_semantics(&cfg(WORKER), V113), vec![]);
    }

    #[test]
    fn semantic_rules_table() {
        // (edit to the clean worker as a strategic patch, expected violation path)
        let cases: &[(&str, &str)] = &[
            ("machine: {type: master}", "machine.type"),
            ("machine: {ca: {key: a2V5}}", "machine.ca.key"),
            ("cluster: {ca: {key: a2V5}}", "cluster.ca.key"),
            ("cluster: {serviceAccount: {key: a2V5}}", "cluster.serviceAccount.key"),
            ("cluster: {aggregatorCA: {crt: eA==, key: a2V5}}", "cluster.aggregatorCA.key"),
            ("cluster: {etcd: {ca: {crt: eA==, key: a2V5}}}", "cluster.etcd.ca.key"),
            ("cluster: {controlPlane: {endpoint: 'http://10.0.0.1:6443'}}", "cluster.controlPlane.endpoint"),
            ("cluster: {controlPlane: {endpoint: 'https://10.0.0.1:99999'}}", "cluster.controlPlane.endpoint"),
            ("machine: {network: {interfaces: [{interface: eth0, vip: {ip: 10.0.0.5}}]}}", "machine.network.interfaces[0].vip"),
            ("machine: {network: {interfaces: [{interface: eth0, vlans: [{vlanId: 5, vip: {ip: 10.0.0.5}}]}]}}", "machine.network.interfaces[0].vlans[0].vip"),
            ("machine: {install: {disk: {$patch: delete}}}", "machine.install"),
            ("machine: {install: {diskSelector: {size: 'lots'}}}", "machine.install.diskSelector.size"),
            ("machine: {install: {diskSelector: {name: sda}}}", "machine.install.diskSelector.name"),
            ("machine: {install: {diskSelector: {type: floppy}}}", "machine.install.diskSelector.type"),
            ("machine: {network: {hostname: a}}\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: b\n", "machine.network.hostname"),
            ("machine: {features: {stableHostname: true}}\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n", "machine.features.stableHostname"),
        ];
        for (edit, want) in cases {
            let p = crate::talos::patch::load_patch(edit).expect("patch");
            let c = crate::talos::patch::apply(&cfg(WORKER), &[p]).expect("apply");
            let v = check_semantics(&c, V113);
            assert!(paths(&v).contains(want), "{edit}: got {v:?}");
        }
    }

    #[test]
    fn control_plane_rules() {
        let cp = WORKER
            .replace("type: worker", "type: controlplane")
            .replace(
                "ca: {crt: Y3J0}\n  install",
                "ca: {crt: Y3J0, key: a2V5}\n  install",
            );
        let mut text = cp.clone();
        text.push_str("  etcd: {ca: {crt: eA==, key: a2V5}}\n");
        assert_eq!(check_semantics(&cfg(&text), V113), vec![]);
        let no_key = cp.replace("ca: {crt: Y3J0, key: a2V5}", "ca: {crt: Y3J0}");
        assert_eq!(
            paths(&check_semantics(&cfg(&no_key), V113)),
            ["machine.ca.key"]
        );
        let vip = format!(
            "{cp}---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: 10.0.0.5\nlink: eth0\n"
        );
        assert_eq!(check_semantics(&cfg(&vip), V113), vec![]);
    }

    #[test]
    fn install_documents_per_version() {
        let v114 = TalosVersion::new(1, 14, 0);
        let no_install = WORKER.replace("  install: {disk: /dev/sda}\n", "");
        let unattended = format!("{no_install}---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller: {{image: x}}\nprovisioning:\n  diskSelector: {{match: 'disk.serial == \"S\"'}}\n");
        assert_eq!(check_semantics(&cfg(&unattended), v114), vec![]);
        assert_eq!(
            paths(&check_semantics(&cfg(&unattended), V113)),
            ["(document UnattendedInstallConfig)"]
        );
        assert_eq!(
            paths(&check_semantics(&cfg(&no_install), v114)),
            ["machine.install"]
        );
    }

    #[test]
    fn endpoints() {
        for ok in [
            "https://10.0.0.1:6443",
            "https://cp.example.com",
            "https://[fd00::1]:6443/",
        ] {
            assert_eq!(check_endpoint(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://x:6443",
            "https://:6443",
            "https://u:p@x:6443",
            "https://x:0",
            "10.0.0.1:6443",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pointers_become_paths() {
        assert_eq!(
            pointer_to_path("/machine/network/interfaces/0/mtu"),
            "machine.network.interfaces[0].mtu"
        );
        assert_eq!(pointer_to_path(""), "(document root)");
    }
}

//! Talos machine configuration, as pure data: the multi-document config itself
//! ([`MachineConfig`]), Talos versions ([`TalosVersion`]), strategic-merge and RFC 6902 patches
//! ([`patch`]), stable install-disk selection ([`disk`]), Image Factory schematic ids
//! ([`schematic`]), schema and semantic validation ([`validate`]), layered rendering
//! ([`render`]), native generation of a role's base config from a secrets bundle
//! ([`generate`]) and the bundle itself ([`secrets`]), and the client certificates, talosconfig
//! and kubeconfig made from a cluster's CAs ([`pki`]).
//!
//! This module owns the meaning of a Talos config. It performs no I/O beyond reading a file whose
//! path it is given (a patch, a JSON schema) and must not import tokio, sqlx, axum, reqwest or any
//! front door; it depends only on `crate::domain` for machine facts.

pub mod disk;
pub mod etcd_db;
pub mod generate;
pub mod kernel;
pub mod patch;
pub mod pki;
pub mod render;
pub mod schematic;
pub mod secret_fields;
pub mod secrets;
pub mod validate;

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use serde_yaml_ng::Value;

/// A Talos release, `v1.13.2` or `1.13`: only what decides config shape (major, minor, patch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TalosVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version (11, 12, 13, ...).
    pub minor: u32,
    /// Patch version (0 when not given).
    pub patch: u32,
}

impl TalosVersion {
    /// A version from its numbers.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        TalosVersion {
            major,
            minor,
            patch,
        }
    }

    /// Whether this release configures installation with the `UnattendedInstallConfig` document
    /// (Talos 1.14 and later) instead of `machine.install`.
    pub fn uses_unattended_install(&self) -> bool {
        *self >= TalosVersion::new(1, 14, 0)
    }

    /// Whether Image Factory serves platform installers (`metal-installer`) for this release
    /// (Talos 1.10 and later); older releases use the plain `installer` image.
    pub fn has_platform_installer(&self) -> bool {
        *self >= TalosVersion::new(1, 10, 0)
    }
}

impl fmt::Display for TalosVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A Talos version string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a Talos version: expected v<major>.<minor>[.<patch>], e.g. v1.13.2")]
pub struct VersionError(pub String);

impl FromStr for TalosVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        // Pre-release and build suffixes (`-beta.1`, `+dirty`) do not change config shape.
        let core = t.split(['-', '+']).next().unwrap_or("");
        let parts: Vec<&str> = core.split('.').collect();
        let num = |p: Option<&&str>| -> Result<u32, VersionError> {
            match p {
                Some(p) => p.parse().map_err(|_| VersionError(s.to_string())),
                None => Ok(0),
            }
        };
        if parts.len() < 2 || parts.len() > 3 {
            return Err(VersionError(s.to_string()));
        }
        Ok(TalosVersion {
            major: num(parts.first())?,
            minor: num(parts.get(1))?,
            patch: num(parts.get(2))?,
        })
    }
}

/// Identity of a config document, as Talos matches documents when patching: `apiVersion`, `kind`
/// and, for named documents, `name`. The v1alpha1 document has no `apiVersion` and the kind
/// `v1alpha1`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DocumentId {
    /// `apiVersion` (empty for the v1alpha1 document).
    pub api_version: String,
    /// `kind` (`v1alpha1` for the v1alpha1 document).
    pub kind: String,
    /// `name` of a named document.
    pub name: Option<String>,
}

/// Kind Talos gives the legacy v1alpha1 document.
pub const V1ALPHA1: &str = "v1alpha1";

impl DocumentId {
    /// The id of the v1alpha1 document.
    pub fn v1alpha1() -> Self {
        DocumentId {
            api_version: String::new(),
            kind: V1ALPHA1.to_string(),
            name: None,
        }
    }

    /// The id of a document; `None` when the document is not a mapping, or names an
    /// `apiVersion` without a `kind` (or the reverse).
    pub fn of(doc: &Value) -> Option<Self> {
        let map = doc.as_mapping()?;
        let text = |k: &str| map.get(k).and_then(scalar_text);
        let api_version = text("apiVersion");
        let kind = text("kind");
        match (api_version, kind) {
            (None, None) => Some(DocumentId::v1alpha1()),
            (Some(api_version), Some(kind)) => Some(DocumentId {
                api_version,
                kind,
                name: text("name"),
            }),
            _ => None,
        }
    }

    /// Whether this is the v1alpha1 document.
    pub fn is_v1alpha1(&self) -> bool {
        self.api_version.is_empty() && self.kind == V1ALPHA1
    }
}

impl fmt::Display for DocumentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_v1alpha1() {
            return f.write_str("v1alpha1");
        }
        write!(f, "{}/{}", self.api_version, self.kind)?;
        if let Some(n) = &self.name {
            write!(f, " `{n}`")?;
        }
        Ok(())
    }
}

/// Error reading a machine config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The text is not YAML.
    #[error("document {index}: not valid YAML: {source}")]
    Yaml {
        /// 0-based document index.
        index: usize,
        /// Parser error (with line and column).
        source: serde_yaml_ng::Error,
    },
    /// A document is not a mapping.
    #[error("document {index}: expected a mapping of config keys, found {found}")]
    NotAMapping {
        /// 0-based document index.
        index: usize,
        /// What was found instead.
        found: &'static str,
    },
    /// A document has `apiVersion` without `kind` or the reverse.
    #[error("document {index}: `apiVersion` and `kind` must be given together")]
    PartialIdentity {
        /// 0-based document index.
        index: usize,
    },
    /// Two documents with the same identity.
    #[error("document {index}: {id} appears twice")]
    Duplicate {
        /// 0-based document index.
        index: usize,
        /// The repeated identity.
        id: DocumentId,
    },
    /// Serialising the config failed.
    #[error("cannot write the config as YAML: {0}")]
    Emit(serde_yaml_ng::Error),
}

/// A Talos machine configuration: one or more YAML documents, in order (the v1alpha1 document and
/// any number of typed documents such as `ExtensionServiceConfig`). Comments are not kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineConfig {
    docs: Vec<Value>,
}

impl MachineConfig {
    /// Parse multi-document YAML (JSON is YAML too). Empty documents are skipped; every other
    /// document must be a mapping with a unique identity.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let docs = parse_documents(text)?;
        let mut seen = Vec::new();
        for (index, doc) in docs.iter().enumerate() {
            let id = document_id_at(index, doc)?;
            if seen.contains(&id) {
                return Err(ConfigError::Duplicate { index, id });
            }
            seen.push(id);
        }
        let mut cfg = MachineConfig { docs };
        for d in &mut cfg.docs {
            normalise_document(d);
        }
        Ok(cfg)
    }

    /// A config made of the given documents, used as they are.
    pub fn from_documents(docs: Vec<Value>) -> Self {
        MachineConfig { docs }
    }

    /// The documents, in order.
    pub fn documents(&self) -> &[Value] {
        &self.docs
    }

    /// The documents, for editing in place.
    pub fn documents_mut(&mut self) -> &mut Vec<Value> {
        &mut self.docs
    }

    /// The documents, by value.
    pub fn into_documents(self) -> Vec<Value> {
        self.docs
    }

    /// The document with this identity.
    pub fn document(&self, id: &DocumentId) -> Option<&Value> {
        self.docs
            .iter()
            .find(|d| DocumentId::of(d).as_ref() == Some(id))
    }

    /// The document with this identity, for editing.
    pub fn document_mut(&mut self, id: &DocumentId) -> Option<&mut Value> {
        self.docs
            .iter_mut()
            .find(|d| DocumentId::of(d).as_ref() == Some(id))
    }

    /// The v1alpha1 document, if there is one.
    pub fn v1alpha1(&self) -> Option<&Value> {
        self.document(&DocumentId::v1alpha1())
    }

    /// The v1alpha1 document, for editing.
    pub fn v1alpha1_mut(&mut self) -> Option<&mut Value> {
        self.document_mut(&DocumentId::v1alpha1())
    }

    /// Multi-document YAML: documents separated by `---` lines.
    pub fn to_yaml(&self) -> Result<String, ConfigError> {
        let mut out = String::new();
        for (i, d) in self.docs.iter().enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            out.push_str(&serde_yaml_ng::to_string(d).map_err(ConfigError::Emit)?);
        }
        Ok(out)
    }
}

/// Split multi-document YAML into values, skipping empty (null) documents.
pub(crate) fn parse_documents(text: &str) -> Result<Vec<Value>, ConfigError> {
    let mut docs = Vec::new();
    for (index, de) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let v = Value::deserialize(de).map_err(|source| ConfigError::Yaml { index, source })?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

pub(crate) fn document_id_at(index: usize, doc: &Value) -> Result<DocumentId, ConfigError> {
    if !doc.is_mapping() {
        return Err(ConfigError::NotAMapping {
            index,
            found: kind_name(doc),
        });
    }
    DocumentId::of(doc).ok_or(ConfigError::PartialIdentity { index })
}

/// Normalisations Talos applies while decoding a document, so that data compares as Talos sees
/// it: leading blank lines of `cluster.inlineManifests[].contents` are dropped (Talos trims
/// `\t\n\v\f\r` there).
pub(crate) fn normalise_document(doc: &mut Value) {
    if !DocumentId::of(doc).is_some_and(|id| id.is_v1alpha1()) {
        return;
    }
    let Some(manifests) = doc
        .get_mut("cluster")
        .and_then(|c| c.get_mut("inlineManifests"))
        .and_then(Value::as_sequence_mut)
    else {
        return;
    };
    for m in manifests {
        if let Some(Value::String(s)) = m.get_mut("contents") {
            let trimmed = s.trim_start_matches(['\t', '\n', '\u{b}', '\u{c}', '\r']);
            if trimmed.len() != s.len() {
                *s = trimmed.to_string();
            }
        }
    }
}

/// The text of a scalar (string, number or bool), as Talos compares scalar values.
pub(crate) fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Tagged(t) => scalar_text(&t.value),
        Value::Null | Value::Sequence(_) | Value::Mapping(_) => None,
    }
}

/// A short name for the type of a value, for error messages.
pub(crate) fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// One step of a YAML path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// Render a path the way an operator reads it: `machine.network.interfaces[0].addresses`.
pub(crate) fn path_text(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => {
                s.push('[');
                s.push_str(&i.to_string());
                s.push(']');
            }
        }
    }
    if s.is_empty() {
        s.push_str("(document root)");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_order() {
        let v: TalosVersion = "v1.13.2".parse().expect("version");
        assert_eq!(v, TalosVersion::new(1, 13, 2));
        assert_eq!(
            "1.14".parse::<TalosVersion>().expect("v"),
            TalosVersion::new(1, 14, 0)
        );
        assert_eq!(
            "v1.14.0-beta.1".parse::<TalosVersion>().expect("v"),
            TalosVersion::new(1, 14, 0)
        );
        assert!("1".parse::<TalosVersion>().is_err());
        assert!("v1.x".parse::<TalosVersion>().is_err());
        assert!(!TalosVersion::new(1, 13, 9).uses_unattended_install());
        assert!(TalosVersion::new(1, 14, 0).uses_unattended_install());
        assert!(!TalosVersion::new(1, 9, 6).has_platform_installer());
        assert!(TalosVersion::new(1, 10, 0).has_platform_installer());
    }

    #[test]
    fn multi_document_round_trip() {
        let text = "---\nversion: v1alpha1\nmachine: {type: worker}\n---\n---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: foo\n";
        let cfg = MachineConfig::parse(text).expect("parse");
        assert_eq!(cfg.documents().len(), 2);
        assert!(cfg.v1alpha1().is_some());
        let id = DocumentId {
            api_version: "v1alpha1".into(),
            kind: "ExtensionServiceConfig".into(),
            name: Some("foo".into()),
        };
        assert!(cfg.document(&id).is_some());
        let again = MachineConfig::parse(&cfg.to_yaml().expect("emit")).expect("reparse");
        assert_eq!(again, cfg);
    }

    #[test]
    fn bad_documents_are_named() {
        let e = MachineConfig::parse("version: v1alpha1\n---\n- a\n").expect_err("list");
        assert!(e.to_string().starts_with("document 1:"), "{e}");
        let e = MachineConfig::parse("apiVersion: v1alpha1\nfoo: 1\n").expect_err("partial");
        assert!(matches!(e, ConfigError::PartialIdentity { index: 0 }));
        let e =
            MachineConfig::parse("version: v1alpha1\n---\nmachine: {}\n").expect_err("duplicate");
        assert!(matches!(e, ConfigError::Duplicate { index: 1, .. }), "{e}");
    }

    #[test]
    fn inline_manifest_leading_newlines_are_trimmed() {
        let cfg = MachineConfig::parse(
            "version: v1alpha1\ncluster:\n  inlineManifests:\n    - name: a\n      contents: |\n\n        ---\n        x: 1\n",
        )
        .expect("parse");
        let c = &cfg.documents()[0]["cluster"]["inlineManifests"][0]["contents"];
        assert_eq!(c.as_str(), Some("---\nx: 1\n"));
    }

    #[test]
    fn paths_read_naturally() {
        let p = [
            Seg::Key("machine".into()),
            Seg::Key("interfaces".into()),
            Seg::Index(0),
            Seg::Key("mtu".into()),
        ];
        assert_eq!(path_text(&p), "machine.interfaces[0].mtu");
        assert_eq!(path_text(&[]), "(document root)");
    }
}

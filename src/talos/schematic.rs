//! Image Factory schematics and their ids, computed offline.
//!
//! Image Factory names a schematic by the SHA-256 of its canonical YAML: the Go YAML encoder's
//! output (4-space indentation, fields in declaration order, empty fields omitted) of its
//! `Schematic` type. [`Schematic`] mirrors that type field for field and [`Schematic::id`]
//! reproduces the encoding of the factory's encoder (go.yaml.in/yaml/v4 `Marshal`, which keeps
//! yaml.v3's layout but single-quotes YAML 1.1 words such as `yes`), so `customization: {}` gets
//! the factory's id `376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba`; the
//! tests hold the factory's own vectors and ids computed with that Go encoder. Where the Go
//! encoder's
//! choice cannot be reproduced with certainty (control characters, tabs, trailing spaces in
//! multi-line values, overlay option keys other than ASCII letters, floats) the id is refused
//! rather than guessed: a wrong id would name another image.
//!
//! Also builds installer image references. Pure logic: no I/O, no imports outside
//! `crate::talos`.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;
use sha2::{Digest, Sha256};

use super::TalosVersion;

/// Why a schematic could not be read or its id computed.
#[derive(Debug, thiserror::Error)]
pub enum SchematicError {
    /// The text is not a schematic.
    #[error("not a valid schematic: {0}")]
    Parse(#[from] serde_yaml_ng::Error),
    /// The canonical form cannot be reproduced with certainty.
    #[error("cannot compute the schematic id offline: {path}: {reason}; register the schematic with Image Factory and use the id it returns")]
    Unsupported {
        /// Field path in the schematic.
        path: String,
        /// What cannot be reproduced.
        reason: String,
    },
}

/// An Image Factory schematic (the factory's `pkg/schematic.Schematic`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schematic {
    /// Overlay for single-board computers and similar.
    #[serde(default)]
    pub overlay: Overlay,
    /// Talos image customization.
    #[serde(default)]
    pub customization: Customization,
}

/// Overlay options of a schematic.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    /// Overlay image.
    #[serde(default)]
    pub image: String,
    /// Overlay name.
    #[serde(default)]
    pub name: String,
    /// Free-form overlay options.
    #[serde(default)]
    pub options: Option<serde_yaml_ng::Mapping>,
}

impl Overlay {
    fn is_zero(&self) -> bool {
        self.image.is_empty()
            && self.name.is_empty()
            && self.options.as_ref().is_none_or(|o| o.is_empty())
    }
}

/// Talos image customization.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Customization {
    /// Machine configuration embedded in the image.
    #[serde(default)]
    pub embedded_machine_configuration: String,
    /// Extra kernel arguments.
    #[serde(default)]
    pub extra_kernel_args: Vec<String>,
    /// Initial META contents.
    #[serde(default)]
    pub meta: Vec<MetaValue>,
    /// System extensions.
    #[serde(default)]
    pub system_extensions: SystemExtensions,
    /// Bootloader kind (`sd-boot`, `grub`, `dual-boot`, `auto`).
    #[serde(default)]
    pub bootloader: String,
    /// SecureBoot options.
    #[serde(default)]
    pub secureboot: SecureBoot,
    /// Disk image options.
    #[serde(default)]
    pub disk_image: DiskImage,
}

/// One META key/value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaValue {
    /// META key (0-255; 0x0a holds initial network configuration).
    pub key: u8,
    /// Value.
    #[serde(default)]
    pub value: String,
}

/// System extensions of a schematic.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SystemExtensions {
    /// Official extensions, e.g. `siderolabs/intel-ucode`.
    #[serde(default)]
    pub official_extensions: Vec<String>,
}

/// SecureBoot options of a schematic.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecureBoot {
    /// How systemd-boot enrolls keys (`off`, `manual`, `if-safe`, `force`).
    #[serde(default)]
    pub enroll_keys: String,
    /// Include well-known UEFI certificates.
    #[serde(default)]
    pub include_well_known_certificates: bool,
}

/// Disk image options of a schematic.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DiskImage {
    /// Sector size in bytes (512 when unset).
    #[serde(default)]
    pub sector_size: u32,
}

/// A schematic id: 64 lower-case hex digits.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SchematicId(String);

impl SchematicId {
    /// An id given by an operator or by Image Factory; `None` unless 64 hex digits.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        (s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit())).then_some(SchematicId(s))
    }

    /// The hex text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SchematicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The id of the empty schematic (`customization: {}`): vanilla Talos.
pub const VANILLA_SCHEMATIC: &str =
    "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

impl Schematic {
    /// Read a schematic from YAML or JSON; unknown fields are refused, as the factory does.
    pub fn parse(text: &str) -> Result<Self, SchematicError> {
        if text.trim().is_empty() {
            return Ok(Schematic::default());
        }
        Ok(serde_yaml_ng::from_str(text)?)
    }

    /// The canonical YAML the factory hashes.
    pub fn canonical_yaml(&self) -> Result<String, SchematicError> {
        let mut top = Vec::new();
        if !self.overlay.is_zero() {
            let mut o = vec![
                ("image", Node::Str(self.overlay.image.clone())),
                ("name", Node::Str(self.overlay.name.clone())),
            ];
            if let Some(opts) = self.overlay.options.as_ref().filter(|o| !o.is_empty()) {
                o.push(("options", options_node(opts, "overlay.options")?));
            }
            top.push(("overlay", Node::map(o)));
        }
        let c = &self.customization;
        let mut cz = Vec::new();
        if !c.embedded_machine_configuration.is_empty() {
            cz.push((
                "embeddedMachineConfiguration",
                Node::Str(c.embedded_machine_configuration.clone()),
            ));
        }
        if !c.extra_kernel_args.is_empty() {
            cz.push(("extraKernelArgs", Node::strs(&c.extra_kernel_args)));
        }
        if !c.meta.is_empty() {
            let items = c
                .meta
                .iter()
                .map(|m| {
                    Node::map(vec![
                        ("key", Node::Int(i64::from(m.key))),
                        ("value", Node::Str(m.value.clone())),
                    ])
                })
                .collect();
            cz.push(("meta", Node::Seq(items)));
        }
        if !c.system_extensions.official_extensions.is_empty() {
            cz.push((
                "systemExtensions",
                Node::map(vec![(
                    "officialExtensions",
                    Node::strs(&c.system_extensions.official_extensions),
                )]),
            ));
        }
        if !c.bootloader.is_empty() {
            cz.push(("bootloader", Node::Str(c.bootloader.clone())));
        }
        let mut sb = Vec::new();
        if !c.secureboot.enroll_keys.is_empty() {
            sb.push(("enrollKeys", Node::Str(c.secureboot.enroll_keys.clone())));
        }
        if c.secureboot.include_well_known_certificates {
            sb.push(("includeWellKnownCertificates", Node::Bool(true)));
        }
        if !sb.is_empty() {
            cz.push(("secureboot", Node::map(sb)));
        }
        if c.disk_image.sector_size != 0 {
            cz.push((
                "diskImage",
                Node::map(vec![(
                    "sectorSize",
                    Node::Int(i64::from(c.disk_image.sector_size)),
                )]),
            ));
        }
        top.push(("customization", Node::map(cz)));
        let mut out = String::new();
        emit_map(&mut out, &Node::map(top), 0, false, "")?;
        Ok(out)
    }

    /// The schematic id: SHA-256 of the canonical YAML, in hex.
    pub fn id(&self) -> Result<SchematicId, SchematicError> {
        let yaml = self.canonical_yaml()?;
        Ok(SchematicId(hex::encode(Sha256::digest(yaml.as_bytes()))))
    }
}

/// The installer image Image Factory serves for a schematic and Talos version:
/// `<host>/metal-installer/<id>:<version>` from Talos 1.10 (platform installers), else
/// `<host>/installer/<id>:<version>`. `host` is e.g. `factory.talos.dev`.
pub fn installer_image(host: &str, id: &SchematicId, version: TalosVersion) -> String {
    let repo = if version.has_platform_installer() {
        "metal-installer"
    } else {
        "installer"
    };
    format!("{}/{repo}/{id}:{version}", host.trim_end_matches('/'))
}

/// A value as the Go encoder sees it.
#[derive(Clone, Debug)]
enum Node {
    Map(Vec<(String, Node)>),
    Seq(Vec<Node>),
    Str(String),
    Int(i64),
    Bool(bool),
    Null,
}

impl Node {
    fn map(entries: Vec<(&str, Node)>) -> Node {
        Node::Map(
            entries
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    }

    fn strs(items: &[String]) -> Node {
        Node::Seq(items.iter().cloned().map(Node::Str).collect())
    }
}

/// Overlay options are a Go `map[string]any`: keys are emitted sorted. Go's YAML encoder sorts
/// keys in a "natural" order that equals byte order only for letters, so other keys are refused.
fn options_node(m: &serde_yaml_ng::Mapping, path: &str) -> Result<Node, SchematicError> {
    let unsupported = |p: &str, reason: &str| SchematicError::Unsupported {
        path: p.to_string(),
        reason: reason.to_string(),
    };
    let mut entries = Vec::new();
    for (k, v) in m {
        let Some(k) = k.as_str() else {
            return Err(unsupported(path, "option keys must be strings"));
        };
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphabetic()) {
            return Err(unsupported(
                &format!("{path}.{k}"),
                "option keys other than ASCII letters sort differently in Go",
            ));
        }
        entries.push((k.to_string(), value_node(v, &format!("{path}.{k}"))?));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Node::Map(entries))
}

fn value_node(v: &Value, path: &str) -> Result<Node, SchematicError> {
    Ok(match v {
        Value::Null => Node::Null,
        Value::Bool(b) => Node::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Node::Int(i),
            None => {
                return Err(SchematicError::Unsupported {
                    path: path.to_string(),
                    reason: "non-integer numbers are not supported".into(),
                })
            }
        },
        Value::String(s) => Node::Str(s.clone()),
        Value::Sequence(items) => Node::Seq(
            items
                .iter()
                .enumerate()
                .map(|(i, it)| value_node(it, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Value::Mapping(m) => options_node(m, path)?,
        Value::Tagged(t) => value_node(&t.value, path)?,
    })
}

// ---------------------------------------------------------------------------------------------
// A block-style YAML emitter reproducing the Go encoder's layout (indent 4): a collection nested
// under a mapping key is indented to the next multiple of 4; a mapping that is a list item starts
// after `- ` and its keys align 2 columns right of the dash.
// ---------------------------------------------------------------------------------------------

const INDENT: usize = 4;

fn next_indent(i: usize) -> usize {
    INDENT * ((i + INDENT) / INDENT)
}

fn pad(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

/// Emit a mapping whose keys sit at column `indent`; with `inline_first` the first key follows
/// a `- ` already written.
fn emit_map(
    out: &mut String,
    node: &Node,
    indent: usize,
    inline_first: bool,
    path: &str,
) -> Result<(), SchematicError> {
    let Node::Map(entries) = node else {
        return Ok(());
    };
    for (i, (k, v)) in entries.iter().enumerate() {
        if !(inline_first && i == 0) {
            pad(out, indent);
        }
        let p = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        out.push_str(&plain_or_quoted(k, &p)?);
        out.push(':');
        emit_value(out, v, indent, &p)?;
    }
    Ok(())
}

/// Emit the value of a key at column `indent`, starting right after the colon.
fn emit_value(out: &mut String, v: &Node, indent: usize, path: &str) -> Result<(), SchematicError> {
    match v {
        Node::Map(e) if e.is_empty() => out.push_str(" {}\n"),
        Node::Seq(s) if s.is_empty() => out.push_str(" []\n"),
        Node::Map(_) => {
            out.push('\n');
            emit_map(out, v, next_indent(indent), false, path)?;
        }
        Node::Seq(items) => {
            out.push('\n');
            let seq_indent = next_indent(indent);
            for (i, it) in items.iter().enumerate() {
                pad(out, seq_indent);
                out.push_str("- ");
                let p = format!("{path}[{i}]");
                match it {
                    Node::Map(e) if !e.is_empty() => emit_map(out, it, seq_indent + 2, true, &p)?,
                    Node::Seq(s) if !s.is_empty() => {
                        return Err(SchematicError::Unsupported {
                            path: p,
                            reason: "lists nested directly in lists are not supported".into(),
                        })
                    }
                    Node::Str(s) if s.contains('\n') => {
                        return Err(SchematicError::Unsupported {
                            path: p,
                            reason: "multi-line list items are not supported".into(),
                        })
                    }
                    _ => {
                        out.push_str(&scalar(it, &p)?);
                        out.push('\n');
                    }
                }
            }
        }
        Node::Str(s) if s.contains('\n') => {
            out.push(' ');
            literal(out, s, next_indent(indent), path)?;
        }
        _ => {
            out.push(' ');
            out.push_str(&scalar(v, path)?);
            out.push('\n');
        }
    }
    Ok(())
}

fn scalar(v: &Node, path: &str) -> Result<String, SchematicError> {
    Ok(match v {
        Node::Str(s) => plain_or_quoted(s, path)?,
        Node::Int(i) => i.to_string(),
        Node::Bool(b) => b.to_string(),
        Node::Null => "null".into(),
        Node::Map(_) => "{}".into(),
        Node::Seq(_) => "[]".into(),
    })
}

/// A multi-line string as a literal block (`|`, `|-` or `|+`), lines at column `indent`.
fn literal(out: &mut String, s: &str, indent: usize, path: &str) -> Result<(), SchematicError> {
    let unsupported = |reason: &str| SchematicError::Unsupported {
        path: path.to_string(),
        reason: reason.to_string(),
    };
    if s.chars()
        .any(|c| c != '\n' && (c.is_control() || c == '\u{feff}'))
    {
        return Err(unsupported(
            "control characters or tabs in a multi-line value",
        ));
    }
    if s.contains(" \n") || s.ends_with(' ') {
        return Err(unsupported("trailing spaces in a multi-line value"));
    }
    if s.starts_with(' ') || s.starts_with('\n') {
        return Err(unsupported(
            "a multi-line value starting with a space or a blank line",
        ));
    }
    out.push('|');
    if !s.ends_with('\n') {
        out.push('-');
    } else if s.len() == 1 || s.ends_with("\n\n") {
        out.push('+');
    }
    out.push('\n');
    let body = s.strip_suffix('\n').unwrap_or(s);
    for line in body.split('\n') {
        if !line.is_empty() {
            pad(out, indent);
            out.push_str(line);
        }
        out.push('\n');
    }
    Ok(())
}

/// A single-line string as the factory's Go encoder (go.yaml.in/yaml/v4 with its v3-compatible
/// `Marshal` defaults) writes it in block context: single-quoted for YAML 1.1 leftovers (`yes`,
/// `off`, `1:20`, `<<`); double-quoted when a plain scalar would read as another type (`true`,
/// `10`, `0x1f`, `null`, `2024-01-01`); plain when that reads back as the same string;
/// single-quoted when plain would be misparsed (indicators, `: `, ` #`, edge spaces).
fn plain_or_quoted(s: &str, path: &str) -> Result<String, SchematicError> {
    if s.chars().any(|c| c.is_control() || c == '\u{feff}') {
        return Err(SchematicError::Unsupported {
            path: path.to_string(),
            reason: "control characters or tabs in a value".into(),
        });
    }
    let single = || format!("'{}'", s.replace('\'', "''"));
    if is_yaml11_leftover(s) {
        return Ok(single());
    }
    if resolves_to_non_string(s) {
        return Ok(format!(
            "\"{}\"",
            s.replace('\\', "\\\\").replace('"', "\\\"")
        ));
    }
    if plain_allowed(s) {
        return Ok(s.to_string());
    }
    Ok(single())
}

/// YAML 1.1 booleans, sexagesimal floats and the merge key, which the encoder single-quotes.
fn is_yaml11_leftover(s: &str) -> bool {
    const OLD_BOOLS: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "n", "N", "no", "No", "NO", "off", "Off",
        "OFF",
    ];
    OLD_BOOLS.contains(&s) || s == "<<" || is_base60_float(s)
}

/// `^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$`
fn is_base60_float(s: &str) -> bool {
    let t = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (main, frac) = match t.split_once('.') {
        Some((m, f)) => (m, Some(f)),
        None => (t, None),
    };
    if frac.is_some_and(|f| !f.chars().all(|c| c.is_ascii_digit() || c == '_')) {
        return false;
    }
    let mut parts = main.split(':');
    let head = parts.next().unwrap_or("");
    let head_ok = head.starts_with(|c: char| c.is_ascii_digit())
        && head.chars().all(|c| c.is_ascii_digit() || c == '_');
    let mut segments = 0;
    for seg in parts {
        let b = seg.as_bytes();
        let ok = match b {
            [d] => d.is_ascii_digit(),
            [a, d] => (b'0'..=b'5').contains(a) && d.is_ascii_digit(),
            _ => false,
        };
        if !ok {
            return false;
        }
        segments += 1;
    }
    head_ok && segments > 0
}

/// Whether a plain scalar with this text would resolve to something other than a string
/// (null, bool, int, float, timestamp), following the encoder's resolver: the first character
/// decides which conversions are tried.
fn resolves_to_non_string(s: &str) -> bool {
    const WORDS: &[&str] = &[
        "", "~", "null", "Null", "NULL", "true", "True", "TRUE", "false", "False", "FALSE", ".inf",
        ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF", ".nan", ".NaN",
        ".NAN",
    ];
    if WORDS.contains(&s) {
        return true;
    }
    match s.chars().next() {
        Some('.') => is_yaml_float(s),
        Some(c) if c.is_ascii_digit() || c == '+' || c == '-' => {
            if looks_like_timestamp(s) {
                return true;
            }
            let plain = s.replace('_', "");
            is_go_int(&plain) || is_yaml_float(&plain)
        }
        _ => false,
    }
}

/// An integer as Go's `strconv.ParseInt(s, 0, 64)` reads it (sign, `0x`, `0o`, `0b`, leading-0
/// octal, decimal); range is not checked (an all-digit string resolves to a float otherwise).
fn is_go_int(s: &str) -> bool {
    let t = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (digits, radix) = match t.get(..2) {
        Some("0x" | "0X") => (&t[2..], 16),
        Some("0o" | "0O") => (&t[2..], 8),
        Some("0b" | "0B") => (&t[2..], 2),
        _ if t.len() > 1 && t.starts_with('0') => (&t[1..], 8),
        _ => (t, 10),
    };
    !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix))
}

/// `^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$`
fn is_yaml_float(s: &str) -> bool {
    let t = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (mant, exp) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let digits = |x: &str| x.chars().all(|c| c.is_ascii_digit());
    let mant_ok = match mant.split_once('.') {
        Some(("", frac)) => !frac.is_empty() && digits(frac),
        Some((int, frac)) => !int.is_empty() && digits(int) && digits(frac),
        None => !mant.is_empty() && digits(mant),
    };
    let exp_ok = exp.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mant_ok && exp_ok
}

/// A date `YYYY-M-D` (month 1-12, day 1-31), alone or followed by a time (`T`, `t` or a space);
/// the time part itself is not checked.
fn looks_like_timestamp(s: &str) -> bool {
    let (date, rest) = match s.find(['T', 't', ' ']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mut it = date.split('-');
    let (Some(y), Some(m), Some(d), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return false;
    };
    let num = |x: &str, max_len: usize| -> Option<u32> {
        (!x.is_empty() && x.len() <= max_len && x.chars().all(|c| c.is_ascii_digit()))
            .then(|| x.parse().ok())
            .flatten()
    };
    y.len() == 4
        && num(y, 4).is_some()
        && num(m, 2).is_some_and(|m| (1..=12).contains(&m))
        && num(d, 2).is_some_and(|d| (1..=31).contains(&d))
        && rest.is_none_or(|r| !r.is_empty())
}

/// Whether libyaml allows this single-line text as a plain scalar in block context.
fn plain_allowed(s: &str) -> bool {
    let chars: Vec<char> = s.chars().collect();
    let (Some(&first), Some(&last)) = (chars.first(), chars.last()) else {
        return false;
    };
    if first == ' ' || last == ' ' {
        return false;
    }
    if s.starts_with("---") || s.starts_with("...") {
        return false;
    }
    let blank_after = |i: usize| chars.get(i + 1).is_none_or(|c| *c == ' ');
    for (i, &c) in chars.iter().enumerate() {
        if i == 0 {
            match c {
                '#' | ',' | '[' | ']' | '{' | '}' | '&' | '*' | '!' | '|' | '>' | '\'' | '"'
                | '%' | '@' | '`' => return false,
                '?' | ':' | '-' if blank_after(i) => return false,
                _ => {}
            }
        } else {
            if c == ':' && blank_after(i) {
                return false;
            }
            if c == '#' && chars[i - 1] == ' ' {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id_of(text: &str) -> String {
        Schematic::parse(text)
            .expect("schematic")
            .id()
            .expect("id")
            .to_string()
    }

    /// Vectors from Image Factory's own tests.
    #[test]
    fn factory_vectors() {
        let cases: &[(&str, &str)] = &[
            ("customization: {}\n", VANILLA_SCHEMATIC),
            ("{}", VANILLA_SCHEMATIC),
            ("", VANILLA_SCHEMATIC),
            (
                r#"customization: {"extraKernelArgs": []}"#,
                VANILLA_SCHEMATIC,
            ),
            (
                r#"{"customization": {"extraKernelArgs": ["noapic", "nolapic"]}}"#,
                "9cba8e32753f91a16c1837ab8abf356af021706ef284aef07380780177d9a06c",
            ),
            (
                r#"{"customization": {"extraKernelArgs": ["noapic", "nolapic"], "systemExtensions": {}}}"#,
                "9cba8e32753f91a16c1837ab8abf356af021706ef284aef07380780177d9a06c",
            ),
            (
                r#"{"customization": {"meta": [{"key": 10, "value": "foo"}], "extraKernelArgs": [], "systemExtensions": {}}}"#,
                "d308a2a5ee2277bed5fbaa104fcbc8d59122abfa737df987a95b4ca763459a7f",
            ),
            (
                r#"{"overlay": {"name": "rpi_generic", "image": "siderolabs/sbc-raspberrypi"}}"#,
                "ee21ef4a5ef808a9b7484cc0dda0f25075021691c8c09a276591eedb638ea1f9",
            ),
            (
                r#"{"overlay": {"name": "rpi_generic", "image": "siderolabs/sbc-raspberrypi"},"customization":{}}"#,
                "ee21ef4a5ef808a9b7484cc0dda0f25075021691c8c09a276591eedb638ea1f9",
            ),
            (
                r#"{"customization":{"secureboot": {"includeWellKnownCertificates": true}}}"#,
                "fa8e05f142a851d3ee568eb0a8e5841eaf6b0ebc8df9a63df16ac5ed2c04f3e6",
            ),
            (
                "customization:\n  diskImage:\n    sectorSize: 4096\n",
                "92833e9ddd9bb9e11b2464fa5525429f01866306d52ebd882ee08d7918f6d1ea",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(id_of(text), *want, "{text}");
        }
    }

    /// Schematics whose ids were computed with the factory's Go encoder (go.yaml.in/yaml/v4,
    /// `Marshal`) over the factory's `Schematic` type: quoting of every scalar class, literal
    /// blocks with each chomping, overlay options, omitted empty sections.
    #[test]
    fn go_encoder_vectors() {
        let cases: &[(&str, &str)] = &[
            (
                r##"customization:
  extraKernelArgs:
    - console=ttyS0,115200n8
    - net.ifnames=0
    - -talos.halt_if_installed
    - "talos.config=https://plinth:8080/config?uuid=${uuid}&token=abc"
    - "1"
    - "yes"
    - "a: b"
    - " lead"
    - "#hash"
    - "x #y"
    - "2024-01-01"
    - "1:20"
    - "0x1F"
    - "1e3"
    - ".5"
    - "~"
    - "it's"
    - "---x"
    - "- a"
    - "-"
    - "?x"
    - "? x"
    - ":x"
    - "a:"
    - "[x]"
    - "x[y]"
    - "{x"
    - "x,y"
    - "@x"
    - "%x"
    - "!x"
    - "&x"
    - "*x"
    - "|x"
    - ">x"
    - "'q'"
    - '"dq"'
    - "`b`"
    - "a b c"
    - "trail "
    - "ünïcode"
    - "1_000"
    - "+1"
    - "-1.5"
    - ".inf"
    - "NaN"
    - "Off"
    - "a\\b"
    - "0o17"
    - "0b101"
    - "12:30:45"
    - "2001-12-14t21:59:43.10-05:00"
    - "null"
    - "Null"
    - "nULL"
    - "TRUE"
    - "tRUE"
    - "<<"
    - "=x"
"##,
                "95c504e39ed3ec3ae783330a23973f2cff7c1ab3a3e8c33d2491b4de3fd7d0b8",
            ),
            (
                r##"customization:
  meta:
    - key: 10
      value: |
        addresses:
          - address: 10.0.0.5/24
            linkName: eth0
        links:
          - name: eth0
            up: true

        routes: []
    - key: 12
      value: "no newline at end\nsecond"
    - key: 13
      value: "two trailing\n\n"
    - key: 14
      value: "x"
  systemExtensions:
    officialExtensions:
      - siderolabs/intel-ucode
      - siderolabs/i915
  bootloader: sd-boot
  secureboot:
    enrollKeys: force
    includeWellKnownCertificates: true
"##,
                "a143c071e1461d229b67264cc925e0462ab90cf80d277d3b86dcfc11bacf2809",
            ),
            (
                r##"overlay:
  image: siderolabs/sbc-raspberrypi
  name: rpi_generic
  options:
    configTxt: |
      gpu_mem=128
    zeta: 1
    alpha: [a, "true", {b: c}]
    mid:
      nested: yes
customization:
  embeddedMachineConfiguration: |
    version: v1alpha1
    machine:
      type: worker
  extraKernelArgs: [a]
"##,
                "c5196b472fb9938844f44d596f55241337093309dc24cceb0dbaffd26636f213",
            ),
            (
                r##"customization:
  meta:
    - key: 10
      value: |-
        a: 1
          b: 2
  extraKernelArgs: ["long arg with many spaces that is definitely longer than eighty characters in total length ok"]
"##,
                "1dad24e07cbf952cdc329260c330498faa9b8a746df5a694ab68bd35fd120127",
            ),
            (
                r##"overlay:
  name: only-name
customization:
  meta:
    - key: 0
      value: ""
    - key: 255
      value: "  two leading spaces"
  bootloader: dual-boot
  secureboot:
    enrollKeys: if-safe
  extraKernelArgs: ["ünïcode=✓", "a=b c", "x=-", "k=v:", "k=: v"]
  diskImage:
    sectorSize: 512
"##,
                "bc3c45a273daaf441efab3dabac11e048f5407aa960f584fa8c4aa3c13e4b724",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(id_of(text), *want, "{text}");
        }
    }

    #[test]
    fn canonical_layout() {
        let s = Schematic::parse(
            "customization:\n  extraKernelArgs: ['console=ttyS0,115200', 'true', '-x: y']\n  meta:\n    - key: 0x0a\n      value: \"a: 1\\nb: 2\\n\"\n  systemExtensions:\n    officialExtensions: [siderolabs/intel-ucode]\n",
        )
        .expect("schematic");
        assert_eq!(
            s.canonical_yaml().expect("yaml"),
            "customization:\n    extraKernelArgs:\n        - console=ttyS0,115200\n        - \"true\"\n        - '-x: y'\n    meta:\n        - key: 10\n          value: |\n            a: 1\n            b: 2\n    systemExtensions:\n        officialExtensions:\n            - siderolabs/intel-ucode\n"
        );
    }

    #[test]
    fn quoting() {
        let cases: &[(&str, &str)] = &[
            ("plain", "plain"),
            ("", "\"\""),
            ("10", "\"10\""),
            ("0x1F", "\"0x1F\""),
            ("1.5", "\"1.5\""),
            ("1e3", "\"1e3\""),
            ("yes", "'yes'"),
            ("Off", "'Off'"),
            ("<<", "'<<'"),
            ("12:30:45", "'12:30:45'"),
            ("+1:5.5", "'+1:5.5'"),
            ("1:60", "1:60"),
            ("_1", "_1"),
            ("+_1", "\"+_1\""),
            ("0755", "\"0755\""),
            ("2024-13-01", "2024-13-01"),
            ("nULL", "nULL"),
            ("null", "\"null\""),
            ("2024-01-01", "\"2024-01-01\""),
            ("1:20", "'1:20'"),
            ("a: b", "'a: b'"),
            ("a:b", "a:b"),
            ("x #y", "'x #y'"),
            ("x#y", "x#y"),
            ("- a", "'- a'"),
            ("-a", "-a"),
            ("*a", "'*a'"),
            ("it's", "it's"),
            ("'q'", "'''q'''"),
            (" lead", "' lead'"),
            (
                "talos.config=https://x/y?u=${uuid}",
                "talos.config=https://x/y?u=${uuid}",
            ),
        ];
        for (s, want) in cases {
            assert_eq!(plain_or_quoted(s, "t").expect("scalar"), *want, "{s:?}");
        }
        assert!(plain_or_quoted("tab\there", "t").is_err());
    }

    #[test]
    fn unknown_fields_and_unsupported_shapes_are_refused() {
        assert!(Schematic::parse("customization: {extensions: []}").is_err());
        let s = Schematic::parse("overlay: {image: i, name: n, options: {config_txt: x}}")
            .expect("parse");
        assert!(matches!(s.id(), Err(SchematicError::Unsupported { .. })));
    }

    #[test]
    fn installer_images_follow_the_version() {
        let id = SchematicId::parse(VANILLA_SCHEMATIC).expect("id");
        assert_eq!(
            installer_image("factory.talos.dev", &id, TalosVersion::new(1, 11, 6)),
            format!("factory.talos.dev/metal-installer/{VANILLA_SCHEMATIC}:v1.11.6")
        );
        assert_eq!(
            installer_image("factory.talos.dev/", &id, TalosVersion::new(1, 9, 2)),
            format!("factory.talos.dev/installer/{VANILLA_SCHEMATIC}:v1.9.2")
        );
        assert!(SchematicId::parse("xyz").is_none());
    }
}

//! RFC 6902 JSON patches (and RFC 6901 JSON pointers) on a single-document [`MachineConfig`],
//! refused on multi-document configs as Talos refuses them. No I/O; imports nothing outside
//! `crate::talos`.

use std::fmt;

use serde_yaml_ng::{Mapping, Value};

use super::PatchError;
use crate::talos::{kind_name, normalise_document, scalar_text, MachineConfig};

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

    /// Whether an operation writes or removes at `keys` (or above or below).
    pub fn touches(&self, keys: &[String]) -> bool {
        self.ops.iter().any(|op| {
            let tokens: Vec<String> = op
                .path()
                .0
                .iter()
                .filter(|t| t.parse::<usize>().is_err() && *t != "-")
                .cloned()
                .collect();
            !matches!(op, JsonOp::Test { .. }) && super::on_path(&tokens, keys)
        })
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

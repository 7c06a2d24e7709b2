//! `Validate()` of the 1.14 `ContainerConfig` document (`pkg/machinery/config/types/container/`:
//! `container_config.go` and the helpers of `mounts.go`, `security.go`, `runtime.go`,
//! `runas.go`), and the whole-set check of its `dependsOn.containers` graph
//! (`pkg/machinery/config/container/container_deps.go`): every dependency names a configured
//! container and the graph has no cycle. Image references are read as go-containerregistry's
//! `name.ParseReference` reads them with default options (Docker Hub default registry, `latest`
//! default tag), which is what Talos uses to normalise the image.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_yaml_ng::Value;

use super::{Ctx, Doc, KindRule, NOW};
use crate::talos::validate::rules::Findings;
use crate::talos::validate::Violation;
use crate::talos::{DocumentId, MachineConfig};

const CONFIG: &str = "pkg/machinery/config/types/container/container_config.go";
const MOUNTS: &str = "pkg/machinery/config/types/container/mounts.go";
const SECURITY: &str = "pkg/machinery/config/types/container/security.go";
const RUNTIME: &str = "pkg/machinery/config/types/container/runtime.go";
const RUNAS: &str = "pkg/machinery/config/types/container/runas.go";
/// The rule file of the dependency graph check.
pub(super) const DEPS: &str = "pkg/machinery/config/container/container_deps.go";

pub(super) const KINDS: &[KindRule] = &[("ContainerConfig", 14, NOW, CONFIG, container)];

const MOUNT_OPTIONS: &[&str] = &[
    "ro", "rw", "noexec", "nosuid", "nodev", "noatime", "rbind", "rshared",
];
const NETWORK_CONDITIONS: &[&str] = &["addresses", "connectivity", "hostname", "etcfiles"];

/// The strings of the list at `path` (non-strings read as empty, the schema reports their type).
fn strings<'a>(d: &Doc<'a, '_>, path: &str) -> Vec<&'a str> {
    d.items(path)
        .iter()
        .map(|v| v.as_str().unwrap_or(""))
        .collect()
}

fn container(d: &mut Doc<'_, '_>, _: &Ctx) {
    let name = d.name();
    if name.is_empty() {
        d.err("name", "name is required");
    } else if name.len() > 63 {
        d.err(
            "name",
            format!("name {name:?} must be 63 characters or fewer"),
        );
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        d.err(
            "name",
            format!(
                "name {name:?}: name can only contain lowercase ASCII letters, digits and hyphens"
            ),
        );
    }

    let image = d.text("image");
    if image.is_empty() {
        d.err("image", "image is required");
    } else {
        match parse_reference(image) {
            Err(e) => d.err("image", format!("invalid image reference {image:?}: {e}")),
            Ok(Reference::Tag) => d.warn(
                "image",
                format!("container {name:?}: image {image:?} is not digest-pinned, the running image may change on restart"),
            ),
            Ok(Reference::Digest) => {}
        }
    }

    for (i, env) in strings(d, "environment").into_iter().enumerate() {
        if !env.contains('=') {
            d.err(
                &format!("environment[{i}]"),
                format!("environment[{i}]: {env:?} must be in KEY=value form"),
            );
        }
    }

    mounts(d);
    if d.at("security").is_some() {
        security(d);
    }
    if let Some(mode) = d.at("network.mode").and_then(Value::as_str) {
        if !matches!(mode, "" | "none" | "host") {
            d.err_in(
                RUNTIME,
                "network.mode",
                format!("unsupported network mode {mode:?}, expected none or host"),
            );
        }
    }
    resources(d);
    if d.at("dependsOn").is_some() {
        depends_on(d, name);
    }
    for id in ["uid", "gid"] {
        if let Some(n) = d.at(&format!("runAs.{id}")).and_then(Value::as_i64) {
            if n < 0 {
                d.err_in(
                    RUNAS,
                    &format!("runAs.{id}"),
                    format!("runAs.{id} must be non-negative, got {n}"),
                );
            }
        }
    }
}

/// `ValidateAbsPath`: set, and absolute (Go's `filepath.IsAbs` on Linux: a leading `/`).
fn abs_path(
    d: &mut Doc<'_, '_>,
    rule: &'static str,
    at: &str,
    prefix: &str,
    kind: &str,
    path: &str,
) {
    if path.is_empty() {
        d.err_in(rule, at, format!("{prefix}{kind} is required"));
    } else if !path.starts_with('/') {
        d.err_in(
            rule,
            at,
            format!("{prefix}{kind} {path:?} must be an absolute path"),
        );
    }
}

fn mount_options(d: &mut Doc<'_, '_>, at: &str, prefix: &str, options: &[&str]) {
    for o in options {
        if !MOUNT_OPTIONS.contains(o) {
            d.err_in(
                MOUNTS,
                at,
                format!("{prefix}unsupported mount option {o:?}"),
            );
        }
    }
    if options.contains(&"ro") && options.contains(&"rw") {
        d.err_in(
            MOUNTS,
            at,
            format!("{prefix}mount options ro and rw are mutually exclusive"),
        );
    }
}

fn mounts(d: &mut Doc<'_, '_>) {
    let mut destinations = HashSet::new();
    for (i, m) in d.items("mounts").iter().enumerate() {
        let base = format!("mounts[{i}]");
        let prefix = format!("mounts[{i}]: ");
        let set = |k: &str| m.get(k).is_some_and(|v| !v.is_null());
        let kinds: Vec<&str> = ["userVolume", "tmpfs", "hostPath"]
            .into_iter()
            .filter(|k| set(k))
            .collect();
        let [kind] = kinds.as_slice() else {
            d.err_in(
                MOUNTS,
                &base,
                format!("{prefix}exactly one of userVolume, tmpfs or hostPath must be set"),
            );
            continue;
        };
        let body = &m[*kind];
        let field = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("");
        let options: Vec<&str> = body
            .get("options")
            .and_then(Value::as_sequence)
            .map(|s| s.iter().map(|v| v.as_str().unwrap_or("")).collect())
            .unwrap_or_default();
        let before = d.f.len();
        if *kind == "userVolume" && field("name").is_empty() {
            d.err_in(
                MOUNTS,
                &format!("{base}.userVolume.name"),
                format!("{prefix}userVolume.name is required"),
            );
        }
        if *kind == "hostPath" {
            abs_path(
                d,
                CONFIG,
                &format!("{base}.hostPath.source"),
                &prefix,
                "hostPath.source",
                field("source"),
            );
        }
        let destination = field("destination");
        abs_path(
            d,
            CONFIG,
            &format!("{base}.{kind}.destination"),
            &prefix,
            &format!("{kind}.destination"),
            destination,
        );
        mount_options(d, &format!("{base}.{kind}.options"), &prefix, &options);
        // A mount with errors is not counted for the duplicate check.
        if d.f.len() != before {
            continue;
        }
        if !destinations.insert(destination.to_string()) {
            d.err_in(
                CONFIG,
                &base,
                format!("{prefix}duplicate destination {destination:?}"),
            );
        }
    }
}

fn security(d: &mut Doc<'_, '_>) {
    let profile = d.text("security.profile");
    if !matches!(profile, "" | "restricted" | "privileged") {
        d.err_in(
            SECURITY,
            "security.profile",
            format!("unsupported security profile {profile:?}, expected restricted or privileged"),
        );
    }
    if d.at("security.capabilities").is_none() {
        return;
    }
    let add = strings(d, "security.capabilities.add");
    let drop = strings(d, "security.capabilities.drop");
    for c in &add {
        if *c == "ALL" {
            d.err_in(
                SECURITY,
                "security.capabilities.add",
                "capabilities.add does not accept ALL, use profile: privileged instead",
            );
            continue;
        }
        if let Err(e) = capability_name("capabilities.add", c) {
            d.err_in(SECURITY, "security.capabilities.add", e);
        }
    }
    for c in &drop {
        if *c == "ALL" {
            continue;
        }
        if let Err(e) = capability_name("capabilities.drop", c) {
            d.err_in(SECURITY, "security.capabilities.drop", e);
        }
    }
    for c in &add {
        if drop.contains(c) {
            d.err_in(
                SECURITY,
                "security.capabilities",
                format!("capability {c:?} appears in both add and drop"),
            );
        }
    }
}

/// `ValidateCapabilityName`: no `CAP_` prefix, upper case, letters and underscores only.
fn capability_name(field: &str, c: &str) -> Result<(), String> {
    if c.is_empty() {
        return Err(format!("{field}: capability name must not be empty"));
    }
    if c.starts_with("CAP_") {
        return Err(format!(
            "{field}: capability {c:?} must be given without the CAP_ prefix"
        ));
    }
    // Go's strings.ToUpper maps every Unicode lower-case letter; to_uppercase does the same.
    if c.to_uppercase() != c {
        return Err(format!("{field}: capability {c:?} must be upper case"));
    }
    if !c.chars().all(|r| r.is_ascii_uppercase() || r == '_') {
        return Err(format!(
            "{field}: capability {c:?} may only contain upper case letters and underscores"
        ));
    }
    Ok(())
}

fn resources(d: &mut Doc<'_, '_>) {
    let memory = d.text("resources.limits.memory");
    if !memory.is_empty() {
        if let Err(e) = crate::talos::disk::parse_size(memory) {
            d.err_in(
                RUNTIME,
                "resources.limits.memory",
                format!("limits.memory {memory:?} is not a valid size: {e}"),
            );
        }
    }
    let cpu = d.text("resources.limits.cpu");
    if !cpu.is_empty() {
        let message = match cpu.strip_suffix('m') {
            None => Some(format!(
                "limits.cpu {cpu:?} must be expressed in millicores, e.g. 1500m"
            )),
            // strconv.ParseUint: decimal digits only, no sign, fits in 64 bits.
            Some(n) => match (n.bytes().all(|b| b.is_ascii_digit()), n.parse::<u64>()) {
                (true, Ok(0)) => Some(format!("limits.cpu {cpu:?} must be greater than zero")),
                (true, Ok(_)) => None,
                _ => Some(format!(
                    "limits.cpu {cpu:?} is not a valid millicore quantity: strconv.ParseUint: parsing {n:?}: {}",
                    if n.bytes().all(|b| b.is_ascii_digit()) && !n.is_empty() {
                        "value out of range"
                    } else {
                        "invalid syntax"
                    }
                )),
            },
        };
        if let Some(m) = message {
            d.err_in(RUNTIME, "resources.limits.cpu", m);
        }
    }
}

fn depends_on(d: &mut Doc<'_, '_>, name: &str) {
    for (i, p) in strings(d, "dependsOn.paths").into_iter().enumerate() {
        abs_path(
            d,
            CONFIG,
            &format!("dependsOn.paths[{i}]"),
            "",
            "dependsOn.paths entry",
            p,
        );
    }
    for (i, c) in strings(d, "dependsOn.networks").into_iter().enumerate() {
        if !NETWORK_CONDITIONS.contains(&c) {
            d.err_in(
                RUNTIME,
                &format!("dependsOn.networks[{i}]"),
                format!("unsupported dependsOn.networks condition {c:?}"),
            );
        }
    }
    for (i, c) in strings(d, "dependsOn.containers").into_iter().enumerate() {
        let at = format!("dependsOn.containers[{i}]");
        if c.is_empty() {
            d.err_in(RUNTIME, &at, "dependsOn.containers entry must not be empty");
        } else if c == name {
            d.err_in(
                RUNTIME,
                &at,
                format!("container {name:?} cannot depend on itself"),
            );
        }
    }
}

/// The whole-set check of `dependsOn.containers` (Talos 1.14): every dependency is a configured
/// container, and the graph is acyclic. Cycles are reported as Talos does: walked from the
/// names in sorted order, each as `a -> b -> a`, sorted and deduplicated, in one error.
pub(super) fn check_dependencies(config: &MachineConfig, out: &mut Vec<Violation>) {
    let containers: Vec<(DocumentId, &Value)> = config
        .documents()
        .iter()
        .filter_map(|d| DocumentId::of(d).map(|id| (id, d)))
        .filter(|(id, _)| id.api_version == "v1alpha1" && id.kind == "ContainerConfig")
        .collect();
    if containers.is_empty() {
        return;
    }
    let name_of = |d: &Value| {
        d.get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let names: HashSet<String> = containers.iter().map(|(_, d)| name_of(d)).collect();
    let mut edges: HashMap<String, Vec<String>> = HashMap::new();
    for (id, d) in &containers {
        let name = name_of(d);
        let deps: Vec<String> = crate::talos::validate::rules::items(d, "dependsOn.containers")
            .iter()
            .map(|v| v.as_str().unwrap_or("").to_string())
            .collect();
        let mut f = Findings::new(&mut *out, id.to_string());
        for (j, dep) in deps.iter().enumerate() {
            if !names.contains(dep) {
                f.error(
                    &format!("dependsOn.containers[{j}]"),
                    DEPS,
                    format!(
                        "container {name:?} depends on container {dep:?}, which is not configured"
                    ),
                );
            }
        }
        edges.insert(name, deps);
    }
    let mut walker = Walker {
        edges: &edges,
        names: &names,
        state: BTreeMap::new(),
        stack: Vec::new(),
        cycles: Vec::new(),
    };
    let mut sorted: Vec<&String> = names.iter().collect();
    sorted.sort();
    for n in sorted {
        walker.visit(n);
    }
    let mut cycles = walker.cycles;
    cycles.sort();
    cycles.dedup();
    if !cycles.is_empty() {
        Findings::new(&mut *out, "(config)".into()).error(
            "ContainerConfig dependsOn.containers",
            DEPS,
            format!("container dependsOn cycle detected: {}", cycles.join(", ")),
        );
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    Visiting,
    Done,
}

/// Depth-first walk of the dependency graph, collecting each cycle it closes.
struct Walker<'a> {
    edges: &'a HashMap<String, Vec<String>>,
    names: &'a HashSet<String>,
    state: BTreeMap<String, Mark>,
    stack: Vec<String>,
    cycles: Vec<String>,
}

impl Walker<'_> {
    fn visit(&mut self, name: &str) {
        match self.state.get(name) {
            Some(Mark::Done) => return,
            Some(Mark::Visiting) => {
                if let Some(idx) = self.stack.iter().position(|s| s == name) {
                    let mut chain: Vec<&str> =
                        self.stack[idx..].iter().map(String::as_str).collect();
                    chain.push(name);
                    self.cycles.push(chain.join(" -> "));
                }
                return;
            }
            None => {}
        }
        self.state.insert(name.to_string(), Mark::Visiting);
        self.stack.push(name.to_string());
        let deps = self.edges.get(name).cloned().unwrap_or_default();
        for dep in deps {
            // An unknown dependency is reported on its own; the walk does not enter it.
            if self.names.contains(&dep) {
                self.visit(&dep);
            }
        }
        self.stack.pop();
        self.state.insert(name.to_string(), Mark::Done);
    }
}

/// What an image reference names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Reference {
    /// A tag (given or the default `latest`): the image may change.
    Tag,
    /// A digest: the image is pinned.
    Digest,
}

/// go-containerregistry's `name.ParseReference` with default options: a tag reference if that
/// parses, else a digest reference, else "could not parse reference". A reference with `@`
/// never parses as a tag (no part of one may hold `@`), so it is pinned exactly when it parses
/// as a digest.
pub(super) fn parse_reference(s: &str) -> Result<Reference, String> {
    if parse_tag(s).is_ok() {
        return Ok(Reference::Tag);
    }
    if parse_digest(s).is_ok() {
        return Ok(Reference::Digest);
    }
    Err(format!("could not parse reference: {s}"))
}

/// `checkElement`: a rune count within bounds and only `allowed` characters.
fn check_element(
    what: &str,
    s: &str,
    allowed: fn(char) -> bool,
    min: usize,
    max: usize,
) -> Result<(), String> {
    let n = s.chars().count();
    if n < min || n > max {
        return Err(format!(
            "{what} must be between {min} and {max} characters in length: {s}"
        ));
    }
    if !s.chars().all(allowed) {
        return Err(format!("{what} has characters it may not contain: {s}"));
    }
    Ok(())
}

fn parse_tag(s: &str) -> Result<(), String> {
    let mut base = s;
    if let Some((b, tag)) = s.rsplit_once(':') {
        if !tag.contains('/') {
            base = b;
            if !tag.is_empty() {
                check_element(
                    "tag",
                    tag,
                    |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'),
                    1,
                    127,
                )?;
            }
        }
    }
    parse_repository(base)
}

fn parse_digest(s: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.split('@').collect();
    let [base, digest] = parts.as_slice() else {
        return Err(format!(
            "a digest must contain exactly one '@' separator: {s}"
        ));
    };
    check_element(
        "digest",
        digest,
        |c| matches!(c, 's' | 'h' | ':' | '0'..='9' | 'a'..='f'),
        71,
        71,
    )?;
    // A tagged base is reduced to its repository (the tag is dropped), else read as one.
    parse_repository(base).or_else(|_| parse_tag(base))
}

fn parse_repository(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("a repository name must be specified".into());
    }
    let (registry, repo) = match s.split_once('/') {
        Some((r, rest)) if r.contains('.') || r.contains(':') => (r, rest),
        _ => ("", s),
    };
    let repo_chars = |c: char| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.' | '/')
    };
    check_element("repository", repo, repo_chars, 2, 255)?;
    check_registry(registry)?;
    // Docker Hub names of one component are read under `library/`.
    let hub = matches!(registry, "" | "docker.io" | "index.docker.io");
    if hub && !repo.contains('/') {
        check_element("repository", &format!("library/{repo}"), repo_chars, 2, 255)?;
    }
    Ok(())
}

/// `checkRegistry`: Go's `url.Parse("//" + name)` must give back `name` as its host: no
/// userinfo, path, query, fragment or escapes, host characters Go allows, a numeric port.
fn check_registry(name: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "registries must be valid RFC 3986 URI authorities: {name}"
        ))
    };
    if name.is_empty() {
        return Ok(());
    }
    let host_char = |c: char| {
        !c.is_ascii()
            || c.is_ascii_alphanumeric()
            || matches!(
                c,
                '-' | '_'
                    | '.'
                    | '~'
                    | '!'
                    | '$'
                    | '&'
                    | '\''
                    | '('
                    | ')'
                    | '*'
                    | '+'
                    | ','
                    | ';'
                    | '='
                    | ':'
                    | '['
                    | ']'
                    | '<'
                    | '>'
                    | '"'
            )
    };
    if !name.chars().all(host_char) {
        return bad();
    }
    let port = if let Some(rest) = name.strip_prefix('[') {
        match rest.split_once(']') {
            Some((_, after)) => after,
            None => return bad(),
        }
    } else {
        name.rfind(':').map_or("", |i| &name[i..])
    };
    let numeric = |p: &str| p.starts_with(':') && p[1..].bytes().all(|b| b.is_ascii_digit());
    if !port.is_empty() && !numeric(port) {
        return bad();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_as_go_containerregistry_reads_them() {
        let d = "sha256:".to_string() + &"a".repeat(64);
        assert_eq!(parse_reference("nginx"), Ok(Reference::Tag));
        // An empty tag is not checked: the default one is used.
        assert_eq!(parse_reference("nginx:"), Ok(Reference::Tag));
        assert_eq!(
            parse_reference("docker.io/library/nginx:1.27"),
            Ok(Reference::Tag)
        );
        assert_eq!(parse_reference("localhost:5000/app"), Ok(Reference::Tag));
        assert_eq!(
            parse_reference(&format!("nginx@{d}")),
            Ok(Reference::Digest)
        );
        assert_eq!(
            parse_reference(&format!("ghcr.io/a/b:v1@{d}")),
            Ok(Reference::Digest)
        );
        for bad in [
            "Nginx",
            "a",
            "nginx:bad tag",
            "ghcr.io/a@sha256:abc",
            "reg:port/app",
            "user@host.io/app",
        ] {
            assert!(parse_reference(bad).is_err(), "{bad}");
        }
    }
}

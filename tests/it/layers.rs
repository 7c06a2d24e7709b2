//! The arrows `../shared/GUIDE.md` allows, read from the `crate::` paths of the source (comments
//! left out), for every layer of `src/`: `domain` and `metrics` import nothing of the crate; Talos'
//! config rules (`talos`) are pure functions over the domain; the ports (`service/ports`) import
//! `domain` and a profile's disk rules (`talos::disk`) only, never a use case; the use cases
//! (`service`) import `domain`, `talos`, the metrics registry and each other, never `store`,
//! `bmc`, `images`, `http` or a front door; `store`, `bmc` (the Redfish client), `images` (the
//! image cache) and `talos_api` (the gRPC client of Talos' apid, which also uses Talos' PKI rules
//! in `talos`) implement the ports and import `domain` and `service::ports` only; the front doors
//! (`dhcp`, `tftp`, `http`) ask the use cases and never reach sideways into each other, the store
//! or a concrete client; settings (`config`) and the declarative inventory reader (`declare`) sit
//! beside the service; the CLI wires what its commands open; `app` wires everything. A file of
//! `src/` that no row covers fails the test, so a new module gets its arrows reviewed.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The `crate::a::b` paths of a file's code (not its comments), as `a::b` (or `a`).
fn crate_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            assert!(
                !rest.starts_with('{'),
                "`crate::{{..}}` hides the modules it imports: one path per module, please: {line}"
            );
            let path: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let mut parts = path.split("::").filter(|p| !p.is_empty());
            let first = parts.next().unwrap_or("").to_string();
            match parts.next() {
                Some(second) if second.chars().all(|c| c.is_ascii_lowercase() || c == '_') => {
                    out.push(format!("{first}::{second}"))
                }
                _ => out.push(first),
            }
        }
    }
    out
}

/// Files of `layer` (a directory of `src/`, or one file `name.rs`) reaching modules that
/// `allowed` does not name (a module, or `module::submodule`; `*` allows all), or reaching out of
/// the layer with `super::super`.
fn violations(layer: &str, skip: &[&str], allowed: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let files = if layer.ends_with(".rs") {
        vec![root.join(layer)]
    } else {
        sources(&root.join(layer))
    };
    for file in files {
        let rel = file
            .strip_prefix(&root)
            .expect("in src")
            .display()
            .to_string();
        if skip.iter().any(|s| rel.starts_with(s)) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read");
        if text
            .lines()
            .any(|l| l.split("//").next().unwrap_or("").contains("super::super"))
        {
            out.push(format!("{rel}: super::super"));
        }
        for p in crate_paths(&text) {
            let module = p.split("::").next().unwrap_or("");
            if !allowed.iter().any(|a| *a == "*" || *a == p || *a == module) {
                out.push(format!("{rel}: crate::{p}"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Every layer of `src/` and what it may name.
const LAYERS: &[(&str, &[&str], &[&str])] = &[
    ("domain", &[], &["domain"]),
    ("metrics.rs", &[], &[]),
    ("talos", &[], &["domain", "talos"]),
    (
        "service/ports",
        &[],
        &["domain", "service::ports", "talos::disk"],
    ),
    (
        "service",
        &["service/ports"],
        &["domain", "talos", "service", "metrics"],
    ),
    ("store", &[], &["domain", "service::ports", "store"]),
    ("bmc", &[], &["domain", "service::ports", "bmc"]),
    ("images", &[], &["domain", "service::ports", "images"]),
    ("objects", &[], &["domain", "service::ports", "objects"]),
    (
        "talos_api",
        &[],
        &["domain", "service::ports", "talos", "talos_api"],
    ),
    ("dhcp", &[], &["domain", "service", "metrics", "dhcp"]),
    ("tftp", &[], &["domain", "service", "metrics", "tftp"]),
    (
        "http",
        &["http/console"],
        &["domain", "service", "metrics", "http"],
    ),
    ("http/console", &[], &["domain", "service", "http"]),
    ("config.rs", &[], &["domain", "service", "config"]),
    (
        "declare.rs",
        &[],
        &["domain", "service", "talos", "declare"],
    ),
    (
        "cli",
        &[],
        &[
            "app", "cli", "config", "declare", "domain", "images", "service", "store", "talos",
        ],
    ),
    ("app.rs", &[], &["*"]),
    ("lib.rs", &[], &[]),
    ("main.rs", &[], &[]),
];

#[test]
fn the_layers_point_only_where_guide_md_allows() {
    for (layer, skip, allowed) in LAYERS {
        let v = violations(layer, skip, allowed);
        assert!(
            v.is_empty(),
            "{layer} may import {allowed:?} only:\n{}",
            v.join("\n")
        );
    }
}

#[test]
fn every_file_of_src_is_in_a_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let uncovered: Vec<String> = sources(&root)
        .into_iter()
        .map(|f| f.strip_prefix(&root).expect("in src").display().to_string())
        .filter(|rel| {
            !LAYERS
                .iter()
                .any(|(layer, _, _)| rel == layer || rel.starts_with(&format!("{layer}/")))
        })
        .collect();
    assert!(
        uncovered.is_empty(),
        "files no layer covers (add their row, with the arrows GUIDE.md allows): {uncovered:?}"
    );
}

#[test]
fn a_path_into_a_use_case_is_seen() {
    // The reader finds what the rule is about: a port that names a use case.
    let text = "use crate::domain::MachineId;\n// crate::store in a comment\nuse crate::service::inventory::Inventory;\nfn f() { crate::talos::disk::x(); }\n";
    assert_eq!(
        crate_paths(text),
        ["domain", "service::inventory", "talos::disk"]
    );
}

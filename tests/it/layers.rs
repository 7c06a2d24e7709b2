//! The arrows `../shared/GUIDE.md` allows, read from the `crate::` paths of the source (comments
//! left out), for the layers below the front doors: `domain` imports nothing of the crate; the
//! ports (`service/ports`) import `domain` and a profile's disk rules (`talos::disk`) only, never
//! a use case; the use cases (`service`) import `domain`, `talos`, the metrics registry and each
//! other, never `store`, `bmc`, `http` or a front door; `store` and `bmc` (the Redfish client)
//! implement the ports and import `domain` and `service::ports` only. (The front doors' rule, nothing sideways, comes with the
//! provisioning service that removes HTTP's call into TFTP.)

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

/// Files of `layer` (a directory of `src/`) reaching modules that `allowed` does not name
/// (a module, or `module::submodule`), or reaching out of the layer with `super::super`.
fn violations(layer: &str, skip: &[&str], allowed: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    for file in sources(&root.join(layer)) {
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
            if !allowed.iter().any(|a| *a == p || *a == module) {
                out.push(format!("{rel}: crate::{p}"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_layers_below_the_front_doors_point_only_where_guide_md_allows() {
    let cases: [(&str, &[&str], &[&str]); 5] = [
        ("domain", &[], &["domain"]),
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
    ];
    for (layer, skip, allowed) in cases {
        let v = violations(layer, skip, allowed);
        assert!(
            v.is_empty(),
            "{layer} may import {allowed:?} only:\n{}",
            v.join("\n")
        );
    }
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

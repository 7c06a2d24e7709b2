//! Inventory errors point at the YAML (issue 16, item 6): `file:line: field.path: message` for a
//! bad field of a profile, a machine or a cluster (a wrong type, an unknown key, a value the rules
//! refuse); a patch that does not load or does not apply is named by its file; and one cause that
//! stops many machines' configs is printed once, with the count and the machines. Before, errors
//! said `file#document`, a patch was `patch layer cluster, patch 0`, and a profile rule that no
//! machine could meet printed one identical error per machine.

use std::path::Path;

use crate::cli::plinth;

/// Write `files` (relative path, text) under `dir`.
fn write(dir: &Path, files: &[(&str, &str)]) {
    for (rel, text) in files {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
    }
}

/// A secrets bundle outside the directory.
fn secrets(dir: &Path) -> String {
    let p = dir.join("lab-secrets.yaml");
    std::fs::write(
        &p,
        plinth::talos::secrets::SecretsBundle::generate()
            .expect("bundle")
            .to_yaml()
            .expect("yaml"),
    )
    .expect("secrets");
    p.display().to_string()
}

#[test]
fn semantic_errors_name_file_line_and_field() {
    let tmp = tempfile::tempdir().expect("tmp");
    let secrets = secrets(tmp.path());
    let inv = tmp.path().join("inv");
    write(
        &inv,
        &[
            (
                "profiles/typo.yaml",
                "kind: Profile\nname: typo\n# the rule's key is misspelt\ninstallDisk:\n  type: nvme\n  sise: [\">= 400GB\"]\n",
            ),
            (
                "profiles/boot.yaml",
                "kind: Profile\nname: boot\ninstallDisk:\n  type: nvme\nbootTarget: floppy\n",
            ),
            (
                "machines/m.yaml",
                "kind: Machine\nhostname: m-1\nrack_unit: 99\ninterfaces:\n  - mac: \"52:54:00:00:e0:01\"\n    boot: true\n\
                 ---\nkind: Machine\nhostname: m-2\ninterfaces:\n  - mac: \"52:54:00:00:e0:02\"\n  - mac: \"not-a-mac\"\n",
            ),
            (
                "machines/zz-again.yaml",
                "# the same host name as machines/m.yaml's first document\nkind: Machine\nhostname: m-1\n",
            ),
            (
                "clusters/lab.yaml",
                &format!(
                    "kind: Cluster\nname: lab\nendpoint: https://192.0.2.10:6443\ntalosVersion: v1.11.6\nsecrets: {secrets}\n\
                     schematicId: nothex\npatches:\n  - ../patches/not-a-patch.yaml\n  - machine: [1, 2]\n"
                ),
            ),
            ("patches/not-a-patch.yaml", "- just: a list\n- of: things\n"),
        ],
    );
    let errors = plinth::declare::load(&inv).expect_err("refused");
    let all = errors.join("\n");
    let has = |prefix: &str| {
        assert!(
            errors.iter().any(|e| e.starts_with(prefix)),
            "no error starting `{prefix}` in:\n{all}"
        )
    };
    // A misspelt key of a profile: the line of the key, the path of the field.
    has("profiles/typo.yaml:6: installDisk.sise: Profile: unknown field `sise`");
    // A value the rules refuse.
    has("profiles/boot.yaml:5: bootTarget: ");
    // A machine field out of range, and a bad MAC in its second document.
    has("machines/m.yaml:3: rack_unit: ");
    has("machines/m.yaml:12: interfaces[1].mac: ");
    // Declared twice: both places.
    has("machines/zz-again.yaml:3: hostname: Machine m-1 is declared twice (first at machines/m.yaml:1)");
    // A cluster field.
    has("clusters/lab.yaml:6: schematicId: `nothex` is not 64 lower-case hex digits");
    // Nothing says `#document` any more.
    assert!(!all.contains(".yaml#"), "{all}");
}

#[test]
fn patch_errors_name_the_patch_file() {
    let tmp = tempfile::tempdir().expect("tmp");
    let secrets = secrets(tmp.path());
    let inv = tmp.path().join("inv");
    write(
        &inv,
        &[
            (
                "clusters/lab.yaml",
                &format!(
                    "kind: Cluster\nname: lab\nendpoint: https://192.0.2.10:6443\ntalosVersion: v1.11.6\nsecrets: {secrets}\n\
                     patches:\n  - ../patches/not-a-patch.yaml\n"
                ),
            ),
            ("patches/not-a-patch.yaml", "- just: a list\n- of: things\n"),
        ],
    );
    let errors = plinth::declare::load(&inv).expect_err("refused");
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("patches/not-a-patch.yaml: not a Talos patch")),
        "{errors:#?}"
    );
}

#[test]
fn one_cause_is_printed_once_with_the_machines_it_stops() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let secrets = secrets(dir);
    let inv = dir.join("inv");
    let mut machines = String::new();
    // Five machines without disk facts on a profile whose two size bounds Talos cannot take as a
    // selector; three on a cluster whose patch removes a key that is not there.
    for i in 1..=5 {
        machines.push_str(&format!(
            "---\nkind: Machine\nhostname: d-{i}\nrole: worker\ncluster: lab\nprofile: two-bounds\n\
             interfaces:\n  - mac: \"52:54:00:00:f0:0{i}\"\n    boot: true\n"
        ));
    }
    for i in 1..=3 {
        machines.push_str(&format!(
            "---\nkind: Machine\nhostname: p-{i}\nrole: worker\ncluster: patched\n\
             interfaces:\n  - mac: \"52:54:00:00:f1:0{i}\"\n    boot: true\n"
        ));
    }
    write(
        &inv,
        &[
            (
                "clusters/lab.yaml",
                &format!(
                    "kind: Cluster\nname: lab\nendpoint: https://192.0.2.10:6443\ntalosVersion: v1.11.6\nsecrets: {secrets}\n\
                     ---\nkind: Cluster\nname: patched\nendpoint: https://192.0.2.20:6443\ntalosVersion: v1.11.6\nsecrets: {secrets}\n\
                     patches:\n  - ../patches/remove-missing.yaml\n"
                ),
            ),
            (
                "patches/remove-missing.yaml",
                "- op: remove\n  path: /machine/plinthNoSuchKey\n",
            ),
            (
                "profiles/two-bounds.yaml",
                "kind: Profile\nname: two-bounds\ninstallDisk:\n  type: nvme\n  size: [\">= 400GB\", \"<= 1TB\"]\n",
            ),
            ("machines/all.yaml", &machines),
        ],
    );
    let config = dir.join("plinth.toml");
    std::fs::write(
        &config,
        format!("data_dir = \"{}\"\n", dir.join("data").display()),
    )
    .expect("config");
    let cfg = config.to_str().expect("utf-8");
    let (code, _, err) = plinth(dir, &["migrate", "--config", cfg], &[]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = plinth(
        dir,
        &["apply", inv.to_str().expect("utf-8"), "--config", cfg],
        &[],
    );
    assert_ne!(code, 0, "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    // The profile's rule, once, at its line, with the five machines.
    let disk: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("profiles/two-bounds.yaml:"))
        .collect();
    assert_eq!(disk.len(), 1, "{err}");
    assert!(
        disk[0].starts_with("error: profiles/two-bounds.yaml:5: installDisk.size: ")
            && disk[0].ends_with("(5 machines: d-1, d-2, d-3, d-4, d-5)"),
        "{err}"
    );
    // The patch, once, by its file, with the three machines.
    let patch: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("remove-missing.yaml"))
        .collect();
    assert_eq!(patch.len(), 1, "{err}");
    assert!(
        patch[0].starts_with(
            "error: patches/remove-missing.yaml: patch of layer cluster does not apply"
        ) && patch[0].contains("plinthNoSuchKey")
            && patch[0].ends_with("(3 machines: p-1, p-2, p-3)"),
        "{err}"
    );
    assert!(!err.contains("patch 0"), "{err}");
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        err.contains("8 machine config(s) would not render or validate (2 cause(s) above)"),
        "{err}"
    );
}

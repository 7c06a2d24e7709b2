//! `plinth config generate`, `plinth config patch` and `plinth config validate` as a user runs
//! them, on the shared Talos reference data.

use crate::support::shared;

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_plinth");

/// YAML data with empty values dropped (Talos adds or omits them per field when re-encoding).
fn normal(v: serde_yaml_ng::Value) -> Option<serde_yaml_ng::Value> {
    use serde_yaml_ng::Value;
    match v {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Sequence(s) => {
            let s: Vec<Value> = s.into_iter().filter_map(normal).collect();
            (!s.is_empty()).then_some(Value::Sequence(s))
        }
        Value::Mapping(m) => {
            let m: serde_yaml_ng::Mapping = m
                .into_iter()
                .filter_map(|(k, v)| normal(v).map(|v| (k, v)))
                .collect();
            (!m.is_empty()).then_some(Value::Mapping(m))
        }
        other => Some(other),
    }
}

fn docs(text: &str) -> Vec<Option<serde_yaml_ng::Value>> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| normal(serde::Deserialize::deserialize(d).expect("yaml")))
        .collect()
}

#[test]
fn config_patch_reproduces_the_talos_vectors() {
    let dir = shared().join("talos/patches/apply");
    let mut args = vec![
        "config".to_string(),
        "patch".into(),
        dir.join("config.yaml").display().to_string(),
    ];
    for p in [
        "strategic1.yaml",
        "jsonpatch1.yaml",
        "jsonpatch2.yaml",
        "strategic2.yaml",
        "strategic3.yaml",
    ] {
        args.push("--patch".into());
        args.push(format!("@{}", dir.join(p).display()));
    }
    let out = Command::new(BIN).args(&args).output().expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = std::fs::read_to_string(dir.join("expected.yaml")).expect("expected");
    assert_eq!(docs(&String::from_utf8_lossy(&out.stdout)), docs(&want));

    let del = shared().join("talos/patches/patchdelete");
    let out = Command::new(BIN)
        .args(["config", "patch"])
        .arg(del.join("config.yaml"))
        .arg("--patch")
        .arg(format!("@{}", del.join("strategic1.yaml").display()))
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = std::fs::read_to_string(del.join("expected.yaml")).expect("expected");
    assert_eq!(docs(&String::from_utf8_lossy(&out.stdout)), docs(&want));

    // An inline patch, and a bad one named in the error.
    let out = Command::new(BIN)
        .args(["config", "patch"])
        .arg(dir.join("config.yaml"))
        .args(["-p", "machine: {network: {hostname: cp-9}}"])
        .output()
        .expect("run");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("hostname: cp-9"));
    let out = Command::new(BIN)
        .args(["config", "patch"])
        .arg(dir.join("config.yaml"))
        .args(["-p", "@/nonexistent.yaml"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.yaml"));
}

#[test]
fn config_validate_accepts_real_configs_and_names_bad_fields() {
    let schema = shared().join("talos/schemas/config.schema.v1.11.6.json");
    let cp = shared().join("talos/configs/controlplane.v1.11.yaml");
    let out = Command::new(BIN)
        .args(["config", "validate"])
        .arg(&cp)
        .args(["--version", "v1.11.6", "--schema"])
        .arg(&schema)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid for Talos"));
    let dir = tempfile::tempdir().expect("tmp");
    let bad = dir.path().join("bad.yaml");
    let text =
        std::fs::read_to_string(&cp)
            .expect("cp")
            .replacen("type: controlplane", "type: bogus", 1);
    std::fs::write(&bad, text).expect("w");
    let out = Command::new(BIN)
        .args(["config", "validate"])
        .arg(&bad)
        .args(["--version", "v1.11.6", "--schema"])
        .arg(&schema)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("machine.type"), "{err}");
}

#[test]
fn config_generate_prints_configs_that_validate() {
    let secrets = shared().join("talos/configs/secrets.yaml");
    let bundle = std::fs::read_to_string(&secrets).expect("secrets");
    let bundle: serde_yaml_ng::Value = serde_yaml_ng::from_str(&bundle).expect("bundle");
    let os_key = bundle["certs"]["os"]["key"].as_str().expect("os key");
    let dir = tempfile::tempdir().expect("tmp");
    for (version, schema, role) in [
        ("v1.11.6", "config.schema.v1.11.6.json", "controlplane"),
        ("v1.11.6", "config.schema.v1.11.6.json", "worker"),
        ("v1.13.9", "config.schema.v1.13.9.json", "controlplane"),
    ] {
        let out = Command::new(BIN)
            .args(["config", "generate", "--secrets"])
            .arg(&secrets)
            .args(["--name", "test", "--endpoint", "https://1.2.3.4:6443"])
            .args(["--talos-version", version, "--role", role])
            .args(["--install-disk", "/dev/sda"])
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "{version} {role}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(text.contains(&format!("type: {role}")), "{text}");
        assert_eq!(
            text.contains(os_key),
            role == "controlplane",
            "{version} {role}"
        );
        let file = dir.path().join(format!("{version}-{role}.yaml"));
        std::fs::write(&file, &text).expect("write");
        let out = Command::new(BIN)
            .args(["config", "validate"])
            .arg(&file)
            .args(["--version", version, "--schema"])
            .arg(shared().join("talos/schemas").join(schema))
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "{version} {role}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let out = Command::new(BIN)
        .args(["config", "generate", "--secrets"])
        .arg(&secrets)
        .args(["--name", "test", "--endpoint", "https://1.2.3.4:6443"])
        .args(["--talos-version", "v1.11.6", "--role", "master"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--role"), "{err}");
    assert!(out.stdout.is_empty());
}

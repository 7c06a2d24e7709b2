//! Talos 1.14 end to end through the CLI, with no schema directory configured (the embedded 1.14
//! schema decides): a bundle from `plinth cluster init --talos-version`, base configs in the shape
//! `talosctl gen config` of v1.14.0-rc.1 writes (one document per concern: 14 on a worker, 28 on
//! a control plane), `plinth config validate` on them, a cluster given as those base configs and
//! one given as the bundle, `plinth apply`, and `plinth config render` of a worker and a control
//! plane of each, validated again.
//!
//! The expected documents, in order, were read from Talos' generator at v1.14.0-rc.1
//! (`pkg/machinery/config/generate/{init,worker,kubernetes,block,security_profile,network}.go`)
//! and its stability test data (`pkg/machinery/config/types/v1alpha1/testdata/stability/v1.14`).

use std::path::Path;

use plinth::talos::MachineConfig;

use crate::talos_configs::Cli;
use serde_yaml_ng::Value;

const TALOS: &str = "v1.14.0-rc.1";

/// The documents of a 1.14 worker, in Talos' order (`None` is the v1alpha1 document).
const WORKER_KINDS: &[Option<&str>] = &[
    None,
    Some("DiscoveryServiceConfig"),
    Some("DiscoveryIdentityConfig"),
    Some("ResolverConfig"),
    Some("VolumeConfig"),
    Some("FilesystemTrimConfig"),
    Some("SecurityProfileConfig"),
    Some("HostnameConfig"),
    Some("KubeClusterConfig"),
    Some("KubeNodeConfig"),
    Some("KubeletConfig"),
    Some("KubeNetworkConfig"),
    Some("KubeAPIServerCAConfig"),
    Some("KubePrismConfig"),
];

/// What a 1.14 control plane has after the worker's documents.
const CONTROL_PLANE_MORE: &[&str] = &[
    "KubeAggregatorCAConfig",
    "KubeAdmissionControlConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthenticationConfig",
    "KubeAuthorizerConfig",
    "KubeAuthorizerConfig",
    "KubeEtcdEncryptionConfig",
    "KubeServiceAccountConfig",
    "KubeAPIServerConfig",
    "KubeControllerManagerConfig",
    "KubeSchedulerConfig",
    "KubeProxyConfig",
    "KubeFlannelCNIConfig",
    "KubeCoreDNSConfig",
];

fn kinds(cfg: &MachineConfig) -> Vec<Option<String>> {
    cfg.documents()
        .iter()
        .map(|d| d.get("kind").and_then(Value::as_str).map(str::to_string))
        .collect()
}

fn want_kinds(control_plane: bool, install: bool) -> Vec<Option<String>> {
    let mut k: Vec<Option<String>> = WORKER_KINDS.iter().map(|k| k.map(str::to_string)).collect();
    if install {
        // After the discovery documents, as Talos' generator appends it.
        k.insert(3, Some("UnattendedInstallConfig".into()));
    }
    if control_plane {
        k.extend(CONTROL_PLANE_MORE.iter().map(|k| Some(k.to_string())));
    }
    k
}

fn doc<'a>(cfg: &'a MachineConfig, kind: &str) -> &'a Value {
    cfg.documents()
        .iter()
        .find(|d| d.get("kind").and_then(Value::as_str) == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} document"))
}

fn validate(run: &Cli, dir: &Path, name: &str, yaml: &str) {
    let f = dir.join(name);
    std::fs::write(&f, yaml).expect("write");
    let (out, err) = run.ok(&[
        "config",
        "validate",
        f.to_str().expect("p"),
        "--version",
        TALOS,
    ]);
    // No warning either: Talos' generator writes nothing its validator warns about.
    assert!(
        out.contains(&format!("valid for Talos {}", "v1.14.0")) && out.contains("(0 warning(s))"),
        "{name}: {out}{err}"
    );
    assert!(!err.contains("warning:"), "{name}: {err}");
}

#[test]
fn a_talos_1_14_cluster_applies_renders_and_validates() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path();
    let config = d.join("plinth.toml");
    // No [talos] schema_dir: the embedded 1.14 schema is what validates.
    std::fs::write(
        &config,
        format!("data_dir = \"{}\"\n", d.join("data").display()),
    )
    .expect("config");
    let run = Cli { config };
    let secrets = d.join("bundle.yaml");
    run.ok(&[
        "cluster",
        "init",
        "gen",
        "--endpoint",
        "https://10.0.0.10:6443",
        "--talos-version",
        TALOS,
        "--out",
        secrets.to_str().expect("p"),
    ]);

    // Base configs as `talosctl gen config` writes them (`--install-disk /dev/sda`, its default).
    for role in ["controlplane", "worker"] {
        let (base, _) = run.ok(&[
            "config",
            "generate",
            "--secrets",
            secrets.to_str().expect("p"),
            "--name",
            "gen",
            "--endpoint",
            "https://10.0.0.10:6443",
            "--talos-version",
            TALOS,
            "--role",
            role,
            "--install-disk",
            "/dev/sda",
        ]);
        let cfg = MachineConfig::parse(&base).expect("parses");
        let cp = role == "controlplane";
        assert_eq!(kinds(&cfg), want_kinds(cp, true), "{role}");
        let n = cfg.documents().len();
        assert_eq!(n, if cp { 29 } else { 15 }, "{role}: {n} documents");
        // The v1alpha1 document keeps only what has no document of its own.
        let v1 = cfg.v1alpha1().expect("v1alpha1");
        let machine_keys: Vec<&str> = v1["machine"]
            .as_mapping()
            .expect("machine")
            .keys()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            machine_keys,
            ["type", "token", "ca", "certSANs", "features"],
            "{role}"
        );
        assert!(v1["cluster"].get("id").is_none() && v1["cluster"].get("ca").is_none());
        assert_eq!(
            v1["cluster"].get("etcd").is_some(),
            cp,
            "{role}: the etcd CA"
        );
        let unattended = doc(&cfg, "UnattendedInstallConfig");
        assert_eq!(
            unattended["provisioning"]["diskSelector"]["match"].as_str(),
            Some("disk.dev_path == \"/dev/sda\"")
        );
        assert_eq!(
            unattended["installer"]["image"].as_str(),
            Some("ghcr.io/siderolabs/installer:v1.14.0")
        );
        let ca = doc(&cfg, "KubeAPIServerCAConfig");
        if cp {
            assert!(ca["issuingCA"]["key"]
                .as_str()
                .is_some_and(|k| k.starts_with("-----BEGIN EC PRIVATE KEY-----")));
            let sa = doc(&cfg, "KubeServiceAccountConfig");
            assert!(sa["issuer"]["privateKey"]
                .as_str()
                .is_some_and(|k| k.starts_with("-----BEGIN RSA PRIVATE KEY-----")));
            assert_eq!(
                sa["issuer"]["issuerURL"].as_str(),
                Some("https://10.0.0.10:6443")
            );
        } else {
            assert!(ca.get("issuingCA").is_none(), "no CA key on a worker");
            assert_eq!(ca["acceptedCAs"].as_sequence().map(Vec::len), Some(1));
            assert!(!base.contains("PRIVATE KEY"), "no private key on a worker");
        }
        validate(&run, d, &format!("{role}.yaml"), &base);
    }

    // Without an install disk Talos' generator leaves the install document out.
    let (no_disk, _) = run.ok(&[
        "config",
        "generate",
        "--secrets",
        secrets.to_str().expect("p"),
        "--name",
        "gen",
        "--endpoint",
        "https://10.0.0.10:6443",
        "--talos-version",
        TALOS,
        "--role",
        "worker",
    ]);
    assert_eq!(
        kinds(&MachineConfig::parse(&no_disk).expect("parses")),
        want_kinds(false, false)
    );

    // Two clusters: `gen` from those base configs, `own` from the bundle (Plinth's own base).
    let inv = d.join("inv");
    std::fs::create_dir_all(&inv).expect("mkdir");
    let mut text = format!(
        "kind: Cluster\nname: gen\nendpoint: https://10.0.0.10:6443\ntalosVersion: {TALOS}\n\
         baseConfigs:\n  controlplane: ../controlplane.yaml\n  worker: ../worker.yaml\n\
         ---\nkind: Cluster\nname: own\nendpoint: https://10.0.0.20:6443\ntalosVersion: {TALOS}\n\
         secrets: ../bundle.yaml\n\
         ---\nkind: Profile\nname: p\ninstallDisk:\n  type: ssd\n"
    );
    // (host, cluster, role, MAC, disk serial, SMBIOS UUID: control planes need one recorded)
    let machines = [
        ("gen-w", "gen", "worker", "52:54:00:00:14:01", "S1401", None),
        (
            "gen-cp",
            "gen",
            "control-plane",
            "52:54:00:00:14:02",
            "S1402",
            Some("6c1f3a2e-58d4-4b7e-a0c9-2e7d1b4f1402"),
        ),
        ("own-w", "own", "worker", "52:54:00:00:14:03", "S1403", None),
        (
            "own-cp",
            "own",
            "control-plane",
            "52:54:00:00:14:04",
            "S1404",
            Some("6c1f3a2e-58d4-4b7e-a0c9-2e7d1b4f1404"),
        ),
    ];
    for (host, cluster, role, mac, serial, uuid) in machines {
        let uuid = uuid
            .map(|u| format!("smbios_uuid: {u}\n"))
            .unwrap_or_default();
        text.push_str(&format!(
            "---\nkind: Machine\nhostname: {host}\nrole: {role}\ncluster: {cluster}\nprofile: p\n{uuid}\
             interfaces:\n  - mac: \"{mac}\"\n    boot: true\ndisks:\n  - serial: {serial}\n    type: ssd\n"
        ));
    }
    std::fs::write(inv.join("all.yaml"), &text).expect("inventory");
    run.ok(&["apply", inv.to_str().expect("p")]);

    for (host, _, role, _, serial, _) in machines {
        let (yaml, err) = run.ok(&["config", "render", host]);
        let cfg = MachineConfig::parse(&yaml).expect("parses");
        let cp = role == "control-plane";
        // Talos' documents in Talos' order, whatever render appended (the install document
        // where the base had none, the boot NIC's link documents).
        let got = kinds(&cfg);
        assert_eq!(
            got.iter()
                .filter(|k| k.as_deref() == Some("UnattendedInstallConfig"))
                .count(),
            1,
            "{host}: {got:?}"
        );
        let ignored = ["LinkAliasConfig", "DHCPv4Config", "UnattendedInstallConfig"];
        let strip = |k: Vec<Option<String>>| -> Vec<Option<String>> {
            k.into_iter()
                .filter(|k| !k.as_deref().is_some_and(|k| ignored.contains(&k)))
                .collect()
        };
        assert_eq!(strip(got), strip(want_kinds(cp, true)), "{host}");
        // The machine's facts, where Talos 1.14 takes them.
        let v1 = cfg.v1alpha1().expect("v1alpha1");
        assert!(v1["machine"].get("install").is_none(), "{host}");
        assert_eq!(doc(&cfg, "HostnameConfig")["hostname"].as_str(), Some(host));
        let disk = doc(&cfg, "UnattendedInstallConfig")["provisioning"]["diskSelector"]["match"]
            .as_str()
            .expect("match")
            .to_string();
        assert!(
            disk.contains(&format!("disk.serial == \"{serial}\"")),
            "{host}: {disk}"
        );
        assert!(
            !err.contains("persist"),
            "{host}: the base warns about itself: {err}"
        );
        validate(&run, d, &format!("{host}.rendered.yaml"), &yaml);
    }
}

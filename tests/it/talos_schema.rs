//! Validation against the JSON schemas of Talos 1.11.6, 1.12.11 and 1.13.9
//! (../shared/talos/schemas) and Talos' own rules: the generated configs of
//! ../shared/talos/configs as they are, configs rendered from them, and configs broken on purpose.

use std::path::PathBuf;

use plinth::domain::{Disk, DiskType};
use plinth::talos::disk::{plan_install_disk, DiskRules};
use plinth::talos::patch::load_patch;
use plinth::talos::render::{render, Installer, Layer, MachineFacts, RenderInput};
use plinth::talos::schematic::{SchematicId, VANILLA_SCHEMATIC};
use plinth::talos::validate::{
    check_semantics, validate, RuleSource, SchemaValidator, Severity, ValidateError,
};
use plinth::talos::{MachineConfig, TalosVersion};

fn shared() -> PathBuf {
    std::env::var_os("PLINTH_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"))
        .join("talos")
}

const VERSIONS: &[&str] = &["1.11.6", "1.12.11", "1.13.9"];

fn version(v: &str) -> TalosVersion {
    v.parse().expect("version")
}

fn schema(v: &str) -> SchemaValidator {
    SchemaValidator::load(
        &shared().join(format!("schemas/config.schema.v{v}.json")),
        version(v),
    )
    .expect("schema")
}

fn config(name: &str) -> MachineConfig {
    let text = std::fs::read_to_string(shared().join("configs").join(name)).expect("read");
    MachineConfig::parse(&text).expect("parse")
}

fn paths(vs: &[plinth::talos::validate::Violation]) -> Vec<&str> {
    vs.iter().map(|v| v.path.as_str()).collect()
}

/// The shared configs come from an old Talos (v0.12 era test data). Every Talos release still
/// decodes them: the fields later schemas no longer document (`persist`,
/// `machine.install.bootloader`, `machine.features.rbac`, `machine.network`) are hidden from the
/// docs (`docgen:nodoc`) but still in the struct Talos decodes into, and `talosctl validate`
/// says nothing about them. So neither does Plinth, with the shared schema files or the embedded
/// ones (1.14 included).
#[test]
fn generated_configs_pass_every_schema_silently() {
    for v in VERSIONS {
        let file = schema(v);
        let embedded = SchemaValidator::embedded(version(v)).expect("embedded");
        for name in ["controlplane.v1.11.yaml", "worker.v1.11.yaml"] {
            assert_eq!(file.check(&config(name)), vec![], "{v} {name}");
            assert_eq!(embedded.check(&config(name)), vec![], "{v} {name}");
        }
    }
    let s114 = SchemaValidator::embedded(version("1.14.0")).expect("embedded 1.14");
    for name in ["controlplane.v1.11.yaml", "worker.v1.11.yaml"] {
        assert_eq!(s114.check(&config(name)), vec![], "1.14 {name}");
    }
}

/// A v1alpha1 field no Talos release decodes is an error ("unknown field"), as Talos' strict
/// decoder makes it.
#[test]
fn unknown_v1alpha1_fields_are_errors_in_every_version() {
    let cp = config("controlplane.v1.11.yaml");
    let p = load_patch("machine: {install: {diskk: /dev/sda}}\npersistt: true\n").expect("patch");
    let c = plinth::talos::patch::apply(&cp, &[p]).expect("apply");
    for v in ["1.11.0", "1.12.0", "1.13.0", "1.14.0"] {
        let s = SchemaValidator::embedded(version(v)).expect("embedded");
        let mut got: Vec<(String, Severity)> = s
            .check(&c)
            .into_iter()
            .map(|x| (x.path, x.severity))
            .collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            [
                ("machine.install.diskk".to_string(), Severity::Error),
                ("persistt".to_string(), Severity::Error)
            ],
            "{v}"
        );
    }
}

/// Schemas of releases Plinth does not ship are refused with the fix named.
#[test]
fn embedded_schemas_cover_1_11_to_1_14_only() {
    let got: Vec<String> = plinth::talos::validate::embedded_schema_versions()
        .map(|(v, _)| format!("{}.{}", v.major, v.minor))
        .collect();
    assert_eq!(got, ["1.11", "1.12", "1.13", "1.14"]);
    let e = SchemaValidator::embedded(version("1.10.9")).expect_err("1.10");
    assert!(e.to_string().contains("schema_dir"), "{e}");
}

#[test]
fn generated_control_plane_config_is_valid_for_every_version() {
    for v in VERSIONS {
        let warnings = validate(&config("controlplane.v1.11.yaml"), &schema(v))
            .unwrap_or_else(|e| panic!("{v}: {e}"));
        assert!(warnings.iter().all(|w| w.source == RuleSource::Schema));
    }
}

/// The shared worker config predates `machine.ca` on workers; current Talos refuses it for that
/// reason alone ("issuing CA or some accepted CAs are required"). With the CA certificate added,
/// as rendering from a secrets bundle does, it is valid.
#[test]
fn generated_worker_config_needs_the_talos_ca_certificate() {
    let worker = config("worker.v1.11.yaml");
    let cp = config("controlplane.v1.11.yaml");
    let crt = cp.documents()[0]["machine"]["ca"]["crt"]
        .as_str()
        .expect("crt")
        .to_string();
    for v in VERSIONS {
        let e = validate(&worker, &schema(v)).expect_err("no machine.ca");
        assert_eq!(paths(&e.errors), ["machine.ca"], "{v}");
        let patch = load_patch(&format!("machine: {{ca: {{crt: {crt}}}}}")).expect("patch");
        let fixed = plinth::talos::patch::apply(&worker, &[patch]).expect("apply");
        validate(&fixed, &schema(v)).unwrap_or_else(|e| panic!("{v}: {e}"));
    }
}

#[test]
fn schema_errors_name_the_yaml_path() {
    let s = schema("1.12.11");
    let cp = config("controlplane.v1.11.yaml");
    let cases: &[(&str, &str)] = &[
        ("machine: {install: {wipe: maybe}}", "machine.install.wipe"),
        ("machine: {kubelet: {bogus: 1}}", "machine.kubelet.bogus"),
        (
            "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nconfigFiles: []\n",
            "(document root)",
        ),
        ("apiVersion: v1alpha1\nkind: NoSuchConfig\n", "kind"),
    ];
    for (edit, want) in cases {
        let p = load_patch(edit).expect("patch");
        let c = plinth::talos::patch::apply(&cp, &[p]).expect("apply");
        let errors: Vec<_> = s
            .check(&c)
            .into_iter()
            .filter(|v| v.severity == Severity::Error)
            .collect();
        assert!(paths(&errors).contains(want), "{edit}: {errors:?}");
    }
}

#[test]
fn a_schema_of_another_version_is_refused() {
    let e = SchemaValidator::load(
        &shared().join("schemas/config.schema.v1.12.11.json"),
        version("1.11.6"),
    )
    .expect_err("mismatch");
    assert!(matches!(e, ValidateError::WrongVersion { .. }), "{e}");
}

fn facts(v: TalosVersion) -> MachineFacts {
    let disks = vec![
        Disk {
            serial: Some("S6B0NL0T123456".into()),
            wwid: Some("eui.002538b1b1a0c5e1".into()),
            model: Some("SAMSUNG MZQL2960HCJR-00A07".into()),
            size_bytes: Some(960_197_124_096),
            disk_type: Some(DiskType::Nvme),
            bus_path: Some("/pci0000:00/0000:00:01.1/0000:01:00.0/nvme".into()),
            data_disk: false,
        },
        Disk {
            serial: Some("ZL2ABCDE".into()),
            size_bytes: Some(16_000_900_661_248),
            disk_type: Some(DiskType::Hdd),
            data_disk: true,
            ..Default::default()
        },
    ];
    let rules: DiskRules =
        serde_yaml_ng::from_str("{type: nvme, size: ['>= 400GB', '<= 2TB']}").expect("rules");
    MachineFacts {
        hostname: Some("cp-01".into()),
        install_disk: Some(plan_install_disk(&rules, &disks, v).expect("disk")),
        installer: Some(Installer::Factory {
            host: "factory.talos.dev".into(),
            schematic: SchematicId::parse(VANILLA_SCHEMATIC).expect("id"),
        }),
        boot_mac: Some("0c:c4:7a:12:34:56".parse().expect("mac")),
        wipe: Some(false),
    }
}

/// Control-plane and worker configs rendered from the shared bases for each release pass its
/// schema and Talos' rules; the install disk is pinned by serial.
#[test]
fn rendered_configs_validate_for_every_version() {
    let cp_base = config("controlplane.v1.11.yaml");
    let crt = cp_base.documents()[0]["machine"]["ca"]["crt"]
        .as_str()
        .expect("crt")
        .to_string();
    let worker_layers = [Layer {
        name: "cluster".into(),
        patches: vec![load_patch(&format!("machine: {{ca: {{crt: {crt}}}}}")).expect("patch")],
    }];
    let worker_base = config("worker.v1.11.yaml");
    for v in VERSIONS {
        let ver = version(v);
        let f = facts(ver);
        for (role, base, layers) in [
            ("controlplane", &cp_base, &[][..]),
            ("worker", &worker_base, &worker_layers[..]),
        ] {
            let out = render(&RenderInput {
                version: ver,
                base,
                layers,
                facts: &f,
            })
            .unwrap_or_else(|e| panic!("{v} {role}: {e}"));
            validate(&out.config, &schema(v)).unwrap_or_else(|e| panic!("{v} {role}: {e}"));
            let install = &out.config.documents()[0]["machine"]["install"];
            assert_eq!(
                install["diskSelector"]["serial"].as_str(),
                Some("S6B0NL0T123456"),
                "{v} {role}"
            );
            assert!(install.get("disk").is_none(), "{v} {role}: /dev/sda left");
            assert!(check_semantics(&out.config, ver).is_empty());
        }
    }
}

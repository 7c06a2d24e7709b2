//! Conformance of Plinth's validation with `talosctl validate --mode metal`, one case per Talos
//! rule Plinth ports, across Talos 1.11 to 1.14. Each case names the Talos source file whose
//! rule decides it and states Talos' verdict for each release, read from Talos' source at the
//! release tags (v1.11.6, v1.12.11, v1.13.9, v1.14.0-rc.1): an error (at a YAML path), a
//! warning (at a path), or accepted (nothing said). A kind a release does not decode is an
//! error at `kind`; a field it does not decode is an error at that field.
//!
//! The base is `talosctl gen config` output (../shared/talos/configs, from Talos' own
//! testdata), valid and silent for every release; each case patches it the way an operator's
//! layer would, and checks the embedded schema plus Talos' rules.

use std::path::PathBuf;

use plinth::talos::patch::{apply, load_patch};
use plinth::talos::validate::{check_semantics, SchemaValidator, Severity, Violation};
use plinth::talos::{MachineConfig, TalosVersion};

fn shared() -> PathBuf {
    std::env::var_os("PLINTH_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"))
        .join("talos")
}

/// Talos' verdict on a config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Refused; an error at this path (in any document).
    Error(&'static str),
    /// Accepted with a warning at this path.
    Warning(&'static str),
    /// Accepted silently.
    Accepted,
}
use Verdict::{Accepted, Error, Warning};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    ControlPlane,
    Worker,
}

struct Case {
    name: &'static str,
    /// The Talos file whose rule decides (for the releases where the rule exists).
    talos: &'static str,
    base: Base,
    patches: &'static [&'static str],
    /// Verdicts for 1.11, 1.12, 1.13, 1.14.
    verdicts: [Verdict; 4],
}

const V1: &str = "pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go";
const HOSTNAME: &str = "pkg/machinery/config/types/network/hostname.go";
const SCHEMA: &str = "pkg/machinery/config/schemas/config.schema.json";
const DECODER: &str = "pkg/machinery/config/configloader/internal/decoder";

const CASES: &[Case] = &[
    Case {
        name: "extraKernelArgs together with grubUseUKICmdline",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["machine: {install: {extraKernelArgs: [console=ttyS0], grubUseUKICmdline: true}}"],
        verdicts: [
            // 1.11 has no grubUseUKICmdline field.
            Error("machine.install.grubUseUKICmdline"),
            Error("machine.install.extraKernelArgs"),
            Error("machine.install.extraKernelArgs"),
            Error("machine.install.extraKernelArgs"),
        ],
    },
    Case {
        name: "extraKernelArgs alone",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["machine: {install: {extraKernelArgs: [console=ttyS0]}}"],
        verdicts: [Accepted, Accepted, Accepted, Accepted],
    },
    Case {
        name: "persist: false",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["persist: false"],
        verdicts: [Error("persist"); 4],
    },
    Case {
        name: "persist: true (hidden from the docs, still decoded)",
        talos: DECODER,
        base: Base::Worker,
        patches: &["persist: true"],
        verdicts: [Accepted; 4],
    },
    Case {
        name: "machine.install.bootloader (docgen:nodoc)",
        talos: DECODER,
        base: Base::ControlPlane,
        patches: &["machine: {install: {bootloader: true}}"],
        verdicts: [Accepted; 4],
    },
    Case {
        name: "an unknown v1alpha1 field",
        talos: DECODER,
        base: Base::ControlPlane,
        patches: &["machine: {install: {diskk: /dev/sda}}"],
        verdicts: [Error("machine.install.diskk"); 4],
    },
    Case {
        name: "HostnameConfig with both auto and hostname",
        talos: HOSTNAME,
        base: Base::Worker,
        patches: &["apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\nhostname: node-1\n"],
        verdicts: [Error("kind"), Error("auto"), Error("auto"), Error("auto")],
    },
    Case {
        name: "HostnameConfig with neither auto nor hostname",
        talos: HOSTNAME,
        base: Base::Worker,
        patches: &["apiVersion: v1alpha1\nkind: HostnameConfig\n"],
        verdicts: [
            Error("kind"),
            Error("(document root)"),
            Error("(document root)"),
            Error("(document root)"),
        ],
    },
    Case {
        name: "HostnameConfig auto: stable alone",
        talos: HOSTNAME,
        base: Base::Worker,
        patches: &["apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n"],
        verdicts: [Error("kind"), Accepted, Accepted, Accepted],
    },
    Case {
        name: "HostnameConfig next to machine.network.hostname",
        talos: HOSTNAME,
        base: Base::Worker,
        patches: &[
            "machine: {network: {hostname: node-1}}",
            "apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: node-2\n",
        ],
        verdicts: [
            Error("kind"),
            Error("machine.network.hostname"),
            Error("machine.network.hostname"),
            Error("machine.network.hostname"),
        ],
    },
    Case {
        name: "ResolverConfig next to machine.network.nameservers",
        talos: "pkg/machinery/config/types/network/resolver.go",
        base: Base::Worker,
        patches: &[
            "machine: {network: {nameservers: [1.1.1.1]}}",
            "apiVersion: v1alpha1\nkind: ResolverConfig\nnameservers: [{address: 8.8.8.8}]\n",
        ],
        verdicts: [
            Error("kind"),
            Error("machine.network.nameservers"),
            Error("machine.network.nameservers"),
            Error("machine.network.nameservers"),
        ],
    },
    Case {
        name: "KubeAPIServerConfig next to cluster.apiServer",
        talos: "pkg/machinery/config/types/k8s/apiserver.go",
        base: Base::ControlPlane,
        patches: &["apiVersion: v1alpha1\nkind: KubeAPIServerConfig\n"],
        verdicts: [
            Error("kind"),
            Error("kind"),
            Error("kind"),
            Error("cluster.apiServer"),
        ],
    },
    Case {
        name: "KubeSpanEndpointsConfig (the schema spells it KubeSpanEndpoints)",
        talos: "pkg/machinery/config/types/network/kubespan_endpoints.go",
        base: Base::Worker,
        patches: &["apiVersion: v1alpha1\nkind: KubeSpanEndpointsConfig\nextraAnnouncedEndpoints: ['192.168.1.1:51820']\n"],
        verdicts: [Accepted; 4],
    },
    Case {
        name: "the schema's misspelling KubeSpanEndpoints is not a kind Talos decodes",
        talos: DECODER,
        base: Base::Worker,
        patches: &["apiVersion: v1alpha1\nkind: KubeSpanEndpoints\nextraAnnouncedEndpoints: ['192.168.1.1:51820']\n"],
        verdicts: [Error("kind"); 4],
    },
    Case {
        name: "hostDNS.forwardKubeDNSToHost without hostDNS.enabled",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["machine: {features: {hostDNS: {enabled: false, forwardKubeDNSToHost: true}}}"],
        verdicts: [
            Accepted,
            Accepted,
            Error("machine.features.hostDNS.forwardKubeDNSToHost"),
            Error("machine.features.hostDNS.forwardKubeDNSToHost"),
        ],
    },
    Case {
        name: "cluster DNS domain that is not a DNS name",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["cluster: {network: {dnsDomain: 'bad domain'}}"],
        verdicts: [Error("cluster.network.dnsDomain"); 4],
    },
    Case {
        name: "two inline manifests of one name",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["cluster: {inlineManifests: [{name: a, contents: x}, {name: a, contents: y}]}"],
        verdicts: [Error("cluster.inlineManifests[1].name"); 4],
    },
    Case {
        name: "discovery service without cluster.id",
        talos: V1,
        base: Base::ControlPlane,
        patches: &[
            "cluster: {discovery: {enabled: true}}",
            "- op: remove\n  path: /cluster/id\n",
        ],
        verdicts: [Error("cluster.id"); 4],
    },
    Case {
        name: "kubelet extraConfig overriding a protected field",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {kubelet: {extraConfig: {port: 1234}}}"],
        verdicts: [Error("machine.kubelet.extraConfig.port"); 4],
    },
    Case {
        name: "kubelet extraConfig of a free field",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {kubelet: {extraConfig: {serverTLSBootstrap: true}}}"],
        verdicts: [Accepted; 4],
    },
    Case {
        name: "etcd subnet together with advertisedSubnets",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["cluster: {etcd: {subnet: 10.0.0.0/8, advertisedSubnets: [10.0.0.0/8]}}"],
        verdicts: [Error("cluster.etcd.subnet"); 4],
    },
    Case {
        name: "machine.install.extensions (deprecated)",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["machine: {install: {extensions: [{image: 'ghcr.io/siderolabs/gvisor:1'}]}}"],
        verdicts: [Warning("machine.install.extensions"); 4],
    },
    Case {
        name: "machine.files (deprecated in 1.14)",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {files: [{content: x, permissions: 0o644, path: /var/f, op: create}]}"],
        verdicts: [
            Accepted,
            Accepted,
            Accepted,
            Warning("machine.files"),
        ],
    },
    Case {
        name: "an unknown CNI name",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["cluster: {network: {cni: {name: calico}}}"],
        verdicts: [Error("cluster.network.cni.name"); 4],
    },
    Case {
        name: "custom CNI without URLs",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["cluster: {network: {cni: {name: custom}}}"],
        verdicts: [Warning("cluster.network.cni.urls"); 4],
    },
    Case {
        name: "KubeSpan MTU below 1280",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {network: {kubespan: {enabled: true, mtu: 1000}}}"],
        verdicts: [Error("machine.network.kubespan.mtu"); 4],
    },
    Case {
        name: "Kubernetes Talos API access on a worker",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {features: {kubernetesTalosAPIAccess: {enabled: true, allowedRoles: ['os:reader']}}}"],
        verdicts: [Error("machine.features.kubernetesTalosAPIAccess"); 4],
    },
    Case {
        name: "Kubernetes Talos API access with the image-verifier role",
        // The role list itself is pkg/machinery/role/role.go.
        talos: V1,
        base: Base::ControlPlane,
        patches: &["machine: {features: {kubernetesTalosAPIAccess: {enabled: true, allowedRoles: ['os:image:verifier']}}}"],
        verdicts: [
            Error("machine.features.kubernetesTalosAPIAccess.allowedRoles[0]"),
            Error("machine.features.kubernetesTalosAPIAccess.allowedRoles[0]"),
            Accepted,
            Accepted,
        ],
    },
    Case {
        name: "one interface with both bond and bridge",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {network: {interfaces: [{interface: br0, bond: {interfaces: [eth0], mode: active-backup}, bridge: {interfaces: [eth1]}}]}}"],
        verdicts: [Error("machine.network.interfaces[0]"); 4],
    },
    Case {
        name: "an interface with the deprecated cidr",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {network: {interfaces: [{interface: eth0, cidr: 10.0.0.2/24}]}}"],
        verdicts: [Warning("machine.network.interfaces[0].cidr"); 4],
    },
    Case {
        name: "bond updelay without miimon",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {network: {interfaces: [{interface: bond0, bond: {interfaces: [eth0, eth1], mode: active-backup, updelay: 200}}]}}"],
        verdicts: [Error("machine.network.interfaces[0].bond.updelay"); 4],
    },
    Case {
        name: "external cloud provider disabled but with manifests",
        talos: V1,
        base: Base::ControlPlane,
        patches: &["cluster: {externalCloudProvider: {enabled: false, manifests: ['https://example.com/ccm.yaml']}}"],
        verdicts: [Error("cluster.externalCloudProvider.manifests"); 4],
    },
    Case {
        name: "a full-disk partition that is not the last",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {disks: [{device: /dev/sdb, partitions: [{mountpoint: /var/a}, {mountpoint: /var/b, size: 1GB}]}]}"],
        verdicts: [Error("machine.disks[0].partitions[0].size"); 4],
    },
    Case {
        name: "system disk encryption without keys",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {systemDiskEncryption: {state: {provider: luks2}}}"],
        verdicts: [Error("machine.systemDiskEncryption.state.keys"); 4],
    },
    Case {
        name: "the Kubernetes CA key on a worker",
        talos: V1,
        base: Base::Worker,
        patches: &["cluster: {ca: {key: a2V5}}"],
        verdicts: [Error("cluster.ca.key"); 4],
    },
    Case {
        name: "etcd on a worker",
        talos: V1,
        base: Base::Worker,
        patches: &["cluster: {etcd: {image: gcr.io/etcd-development/etcd:v3.5.0}}"],
        verdicts: [Error("cluster.etcd"); 4],
    },
    Case {
        name: "a plain http control-plane endpoint",
        talos: V1,
        base: Base::Worker,
        patches: &["cluster: {controlPlane: {endpoint: 'http://10.0.0.1:6443'}}"],
        verdicts: [Error("cluster.controlPlane.endpoint"); 4],
    },
    Case {
        name: "an unknown machine type",
        talos: V1,
        base: Base::Worker,
        patches: &["machine: {type: master}"],
        verdicts: [Error("machine.type"); 4],
    },
    Case {
        name: "a wrongly typed field",
        talos: SCHEMA,
        base: Base::ControlPlane,
        patches: &["machine: {install: {wipe: maybe}}"],
        verdicts: [Error("machine.install.wipe"); 4],
    },
];

fn base(b: Base) -> MachineConfig {
    let (name, other) = match b {
        Base::ControlPlane => ("controlplane.v1.11.yaml", None),
        // The shared worker predates machine.ca on workers: add the certificate, as rendering
        // from a secrets bundle does.
        Base::Worker => ("worker.v1.11.yaml", Some("controlplane.v1.11.yaml")),
    };
    let read = |n: &str| {
        let text = std::fs::read_to_string(shared().join("configs").join(n)).expect("read");
        MachineConfig::parse(&text).expect("parse")
    };
    let cfg = read(name);
    match other {
        None => cfg,
        Some(cp) => {
            let crt = read(cp).documents()[0]["machine"]["ca"]["crt"]
                .as_str()
                .expect("crt")
                .to_string();
            let p = load_patch(&format!("machine: {{ca: {{crt: {crt}}}}}")).expect("patch");
            apply(&cfg, &[p]).expect("apply")
        }
    }
}

fn findings(cfg: &MachineConfig, v: TalosVersion) -> Vec<Violation> {
    let schema = SchemaValidator::embedded(v).expect("embedded schema");
    let mut all = schema.check(cfg);
    all.extend(check_semantics(cfg, v));
    all
}

#[test]
fn every_base_is_valid_and_silent_for_every_release() {
    for minor in 11..=14 {
        let v = TalosVersion::new(1, minor, 0);
        for b in [Base::ControlPlane, Base::Worker] {
            assert_eq!(findings(&base(b), v), vec![], "1.{minor} {b:?}");
        }
    }
}

#[test]
fn plinth_decides_as_talos_validate_does() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in CASES {
        let patches: Vec<_> = case
            .patches
            .iter()
            .map(|p| load_patch(p).unwrap_or_else(|e| panic!("{}: {e}", case.name)))
            .collect();
        let cfg =
            apply(&base(case.base), &patches).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        for (i, want) in case.verdicts.iter().enumerate() {
            let v = TalosVersion::new(1, 11 + i as u32, 0);
            let found = findings(&cfg, v);
            let errors: Vec<&Violation> = found
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .collect();
            let warnings: Vec<&Violation> = found
                .iter()
                .filter(|f| f.severity == Severity::Warning)
                .collect();
            let ok = match want {
                Error(path) => errors.iter().any(|e| e.path == *path),
                Warning(path) => errors.is_empty() && warnings.iter().any(|w| w.path == *path),
                Accepted => found.is_empty(),
            };
            // Where the rule is Talos' own, the finding names the Talos file.
            let named = match want {
                Error(path) | Warning(path) if case.talos != DECODER && case.talos != SCHEMA => {
                    found
                        .iter()
                        .filter(|f| f.path == *path)
                        .any(|f| f.rule == case.talos || f.rule == SCHEMA)
                }
                _ => true,
            };
            checked += 1;
            if !ok || !named {
                failures.push(format!(
                    "{} (1.{}): Talos says {want:?} ({}); Plinth found {:#?}",
                    case.name,
                    11 + i,
                    case.talos,
                    found
                        .iter()
                        .map(|f| format!(
                            "{:?} {} {}: {} [{}]",
                            f.severity, f.document, f.path, f.message, f.rule
                        ))
                        .collect::<Vec<_>>()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} verdicts differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(checked, CASES.len() * 4);
}

//! The base machine config of a role, generated natively from a secrets bundle in the shape
//! `talosctl gen config` writes for the target Talos release, so a site needs no Go tooling: up to
//! 1.13 the v1alpha1 document (machine and cluster sections, with the CA keys and Kubernetes
//! secrets only on control planes) and, from Talos 1.12, the `HostnameConfig` document with a
//! stable hostname; from 1.14 a slim v1alpha1 document and one document per concern (discovery,
//! resolver, volumes, security profile, hostname and the Kubernetes documents): 14 documents on a
//! worker, 28 on a control plane, plus `UnattendedInstallConfig` when the install disk is known.
//!
//! The shape follows Talos's config generator (`pkg/machinery/config/generate`) and its version
//! contract per release (1.11 to 1.14 are supported; their encoding-stability test data,
//! `pkg/machinery/config/types/v1alpha1/testdata/stability`, was the reference). The result is
//! the `base` of [`crate::talos::render`]: the install disk is left to the machine's facts unless
//! [`GenerateOptions::install_disk`] names one. This module is pure: no I/O, no logging (its
//! input and output carry private keys), and it imports nothing outside `crate::talos` and
//! `crate::domain`.

use serde_yaml_ng::{Mapping, Value};

use super::secrets::SecretsBundle;
use super::{MachineConfig, TalosVersion};
use crate::domain::Role;

/// Kubernetes DNS domain `talosctl gen config` uses unless told otherwise.
pub const DEFAULT_DNS_DOMAIN: &str = "cluster.local";
/// Pod network `talosctl gen config` uses for an IPv4 cluster.
pub const DEFAULT_POD_SUBNET: &str = "10.244.0.0/16";
/// Service network `talosctl gen config` uses for an IPv4 cluster.
pub const DEFAULT_SERVICE_SUBNET: &str = "10.96.0.0/12";
/// KubePrism port Talos enables by default.
const KUBEPRISM_PORT: u64 = 7445;
/// Label that keeps control planes out of external load balancers (Talos > 1.7).
const EXCLUDE_FROM_EXTERNAL_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// The control-plane role label, and the taint Talos 1.14 writes with it.
const CONTROL_PLANE_ROLE: &str = "node-role.kubernetes.io/control-plane";
/// `DefaultDiscoveryServiceEndpoint`.
const DISCOVERY_SERVICE_ENDPOINT: &str = "https://discovery.talos.dev/";

/// Oldest and newest Talos minor releases whose generated shape this module knows.
const SUPPORTED_MINORS: std::ops::RangeInclusive<u32> = 11..=14;

/// The default Kubernetes version of each Talos release (`DefaultKubernetesVersion` of the
/// release's `pkg/machinery/constants`): (minor, first patch with this default, version).
/// Later patches of a listed minor keep the last default known here.
const KUBERNETES_DEFAULTS: &[(u32, u32, &str)] = &[
    (11, 0, "1.34.0"),
    (11, 2, "1.34.1"),
    (12, 0, "1.35.0"),
    (12, 5, "1.35.2"),
    (12, 7, "1.35.4"),
    (13, 0, "1.36.0"),
    (13, 3, "1.36.1"),
    (13, 5, "1.36.2"),
    (13, 9, "1.36.3"),
    // v1.14.0-rc.1 (the release candidate whose schema Plinth embeds).
    (14, 0, "1.37.0-rc.0"),
];

/// Why a config could not be generated. Messages name fields, never their values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    /// The target release is not one whose generated shape is known.
    #[error("generating configs for Talos {version} is not supported: Plinth knows the shape `talosctl gen config` writes for Talos 1.11 to 1.14; generate the base config with talosctl of that release and configure it as a file")]
    UnsupportedVersion {
        /// The release asked for.
        version: TalosVersion,
    },
    /// The secrets bundle lacks values every config needs.
    #[error("the secrets bundle has no value for {}; generate a complete one with `plinth cluster init` or `talosctl gen secrets`", .fields.join(", "))]
    IncompleteBundle {
        /// Bundle fields, e.g. `certs.os.crt`.
        fields: Vec<&'static str>,
    },
    /// A bundle value is not in the form the bundle keeps it (base64 of PEM text).
    #[error("the secrets bundle's {field} is not base64 of PEM text")]
    BundleEncoding {
        /// Bundle field, e.g. `certs.k8s.crt`.
        field: &'static str,
    },
    /// An option is not usable.
    #[error("{field}: {reason}")]
    Option {
        /// The option.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// What a cluster's base configs are generated from, besides its secrets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerateOptions {
    /// Cluster name (`cluster.clusterName`).
    pub cluster_name: String,
    /// Control-plane endpoint, an https URL such as `https://10.0.0.10:6443` (usually a VIP or a
    /// load balancer).
    pub endpoint: String,
    /// Target Talos release; decides the shape of the config.
    pub version: TalosVersion,
    /// Kubernetes version (`1.34.1`, a leading `v` is dropped); `None` takes the default of the
    /// Talos release ([`default_kubernetes_version`]).
    pub kubernetes_version: Option<String>,
    /// Installer image; `None` takes `ghcr.io/siderolabs/installer:<version>` as `talosctl` does.
    pub install_image: Option<String>,
    /// Install disk (`machine.install.disk`); `None` leaves it to the machine's facts at render
    /// time (`talosctl gen config` writes `/dev/sda` unless told otherwise).
    pub install_disk: Option<String>,
    /// Extra names and addresses for the Talos API and Kubernetes API certificates
    /// (`machine.certSANs`, `cluster.apiServer.certSANs`), as `talosctl --additional-sans`.
    pub additional_sans: Vec<String>,
    /// Kubernetes DNS domain.
    pub dns_domain: String,
    /// Pod networks (CIDR).
    pub pod_subnets: Vec<String>,
    /// Service networks (CIDR).
    pub service_subnets: Vec<String>,
}

impl GenerateOptions {
    /// Options with Talos's defaults for everything but the cluster's name, endpoint and release.
    pub fn new(
        cluster_name: impl Into<String>,
        endpoint: impl Into<String>,
        version: TalosVersion,
    ) -> Self {
        GenerateOptions {
            cluster_name: cluster_name.into(),
            endpoint: endpoint.into(),
            version,
            kubernetes_version: None,
            install_image: None,
            install_disk: None,
            additional_sans: Vec::new(),
            dns_domain: DEFAULT_DNS_DOMAIN.to_string(),
            pod_subnets: vec![DEFAULT_POD_SUBNET.to_string()],
            service_subnets: vec![DEFAULT_SERVICE_SUBNET.to_string()],
        }
    }
}

/// Whether [`generate`] knows the config shape of this Talos release.
pub fn is_supported(version: TalosVersion) -> bool {
    version.major == 1 && SUPPORTED_MINORS.contains(&version.minor)
}

/// The Kubernetes version `talosctl gen config` of this Talos release uses by default; `None`
/// for releases this module does not know.
pub fn default_kubernetes_version(version: TalosVersion) -> Option<&'static str> {
    if version.major != 1 {
        return None;
    }
    KUBERNETES_DEFAULTS
        .iter()
        .filter(|(minor, from, _)| *minor == version.minor && *from <= version.patch)
        .map(|(_, _, k8s)| *k8s)
        .next_back()
}

/// The installer image `talosctl gen config` uses by default.
pub fn default_install_image(version: TalosVersion) -> String {
    format!("ghcr.io/siderolabs/installer:{version}")
}

/// Generate the base machine config of `role` for the cluster of `bundle`.
pub fn generate(
    bundle: &SecretsBundle,
    role: Role,
    opts: &GenerateOptions,
) -> Result<MachineConfig, GenerateError> {
    let version = opts.version;
    if !is_supported(version) {
        return Err(GenerateError::UnsupportedVersion { version });
    }
    let secrets = Secrets::of(bundle)?;
    let host = endpoint_host(&opts.endpoint)?;
    if opts.cluster_name.trim().is_empty() {
        return Err(GenerateError::Option {
            field: "cluster_name",
            reason: "must not be empty".into(),
        });
    }
    let k8s = match &opts.kubernetes_version {
        Some(v) => {
            let v = v.trim().trim_start_matches('v');
            check_kubernetes_version(v)?;
            v.to_string()
        }
        None => default_kubernetes_version(version)
            .ok_or(GenerateError::UnsupportedVersion { version })?
            .to_string(),
    };
    check_subnets("pod_subnets", &opts.pod_subnets)?;
    check_subnets("service_subnets", &opts.service_subnets)?;
    if opts.dns_domain.trim().is_empty() {
        return Err(GenerateError::Option {
            field: "dns_domain",
            reason: "must not be empty".into(),
        });
    }
    let shape = Shape::of(version);
    let control_plane = role == Role::ControlPlane;
    if version >= TalosVersion::new(1, 14, 0) {
        return multidoc(&secrets, control_plane, &k8s, opts).map(MachineConfig::from_documents);
    }

    let mut doc = Mapping::new();
    put(&mut doc, "version", "v1alpha1");
    put(&mut doc, "debug", false);
    put(&mut doc, "persist", true);
    put(
        &mut doc,
        "machine",
        machine_section(&secrets, control_plane, &k8s, opts, shape),
    );
    put(
        &mut doc,
        "cluster",
        cluster_section(&secrets, control_plane, &k8s, &host, opts, shape),
    );

    let mut docs = vec![Value::Mapping(doc)];
    if shape.network_documents {
        let mut hostname = Mapping::new();
        put(&mut hostname, "apiVersion", "v1alpha1");
        put(&mut hostname, "kind", "HostnameConfig");
        put(&mut hostname, "auto", "stable");
        docs.push(Value::Mapping(hostname));
    }
    Ok(MachineConfig::from_documents(docs))
}

/// What changes between the supported releases, as Talos's version contract decides it.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// 1.11 and before: `machine.features.rbac`, `stableHostname`, `apidCheckExtKeyUsage` and
    /// `cluster.apiServer.disablePodSecurityPolicy` are written, and the endpoint's host is the
    /// first API server SAN. From 1.12 these are hidden, and the stable hostname moves to a
    /// `HostnameConfig` document.
    legacy_features: bool,
    /// 1.12 and later: network settings in their own documents (`HostnameConfig`).
    network_documents: bool,
    /// 1.12 and later: `machine.install.grubUseUKICmdline: true`.
    grub_uki_cmdline: bool,
    /// Up to 1.12: an empty `machine.network` is still written.
    empty_machine_network: bool,
}

impl Shape {
    fn of(v: TalosVersion) -> Self {
        let after_1_11 = v >= TalosVersion::new(1, 12, 0);
        Shape {
            legacy_features: !after_1_11,
            network_documents: after_1_11,
            grub_uki_cmdline: after_1_11,
            empty_machine_network: v < TalosVersion::new(1, 13, 0),
        }
    }
}

/// The bundle's values, checked present.
struct Secrets<'a> {
    bundle: &'a SecretsBundle,
    os_crt: &'a str,
    k8s_crt: &'a str,
    aggregator_crt: &'a str,
    etcd_crt: &'a str,
}

impl<'a> Secrets<'a> {
    fn of(bundle: &'a SecretsBundle) -> Result<Self, GenerateError> {
        let mut missing = Vec::new();
        let mut need = |field: &'static str, value: &str| {
            if value.trim().is_empty() {
                missing.push(field);
            }
        };
        need("cluster.id", &bundle.cluster.id);
        need("cluster.secret", &bundle.cluster.secret);
        need("secrets.bootstraptoken", &bundle.secrets.bootstraptoken);
        // Either key: secretbox since Talos 1.3, AES-CBC in older bundles.
        let encryption = if bundle.secrets.aescbcencryptionsecret.trim().is_empty() {
            &bundle.secrets.secretboxencryptionsecret
        } else {
            &bundle.secrets.aescbcencryptionsecret
        };
        need("secrets.secretboxencryptionsecret", encryption);
        need("trustdinfo.token", &bundle.trustdinfo.token);
        let c = &bundle.certs;
        let crt = |ck: &'a super::secrets::CertAndKey| ck.crt.as_deref().unwrap_or("");
        need("certs.os.crt", crt(&c.os));
        need("certs.os.key", &c.os.key);
        need("certs.k8s.crt", crt(&c.k8s));
        need("certs.k8s.key", &c.k8s.key);
        need("certs.k8saggregator.crt", crt(&c.k8saggregator));
        need("certs.k8saggregator.key", &c.k8saggregator.key);
        need("certs.k8sserviceaccount.key", &c.k8sserviceaccount.key);
        need("certs.etcd.crt", crt(&c.etcd));
        need("certs.etcd.key", &c.etcd.key);
        if !missing.is_empty() {
            return Err(GenerateError::IncompleteBundle { fields: missing });
        }
        Ok(Secrets {
            bundle,
            os_crt: crt(&c.os),
            k8s_crt: crt(&c.k8s),
            aggregator_crt: crt(&c.k8saggregator),
            etcd_crt: crt(&c.etcd),
        })
    }
}

/// A bundle value (base64 of PEM) as the PEM text the 1.14 documents hold.
fn pem_text(b64: &str, field: &'static str) -> Result<String, GenerateError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()
        .and_then(|raw| String::from_utf8(raw).ok())
        .filter(|t| t.contains("-----BEGIN "))
        .ok_or(GenerateError::BundleEncoding { field })
}

/// A multi-document config document: `apiVersion: v1alpha1`, `kind`, then `fields`.
fn document(kind: &str, fields: Vec<(&str, Value)>) -> Value {
    let mut m = Mapping::new();
    put(&mut m, "apiVersion", "v1alpha1");
    put(&mut m, "kind", kind);
    for (k, v) in fields {
        put(&mut m, k, v);
    }
    Value::Mapping(m)
}

/// The documents `talosctl gen config` of Talos 1.14 writes (`init.go`, `worker.go`,
/// `kubernetes.go`, `block.go`, `security_profile.go`, `network.go` of
/// `pkg/machinery/config/generate` at v1.14.0-rc.1, with discovery on as the CLI defaults), in its
/// order. The v1alpha1 document keeps only what has no document of its own: the machine type,
/// trustd token, Talos API CA, API SANs, features, the bootstrap token and (control planes) the
/// etcd CA.
fn multidoc(
    s: &Secrets<'_>,
    control_plane: bool,
    k8s: &str,
    opts: &GenerateOptions,
) -> Result<Vec<Value>, GenerateError> {
    let b = s.bundle;
    let endpoint = opts.endpoint.trim();

    let mut machine = Mapping::new();
    put(
        &mut machine,
        "type",
        if control_plane {
            "controlplane"
        } else {
            "worker"
        },
    );
    put(&mut machine, "token", b.trustdinfo.token.as_str());
    let os_key = if control_plane {
        b.certs.os.key.as_str()
    } else {
        ""
    };
    put(&mut machine, "ca", cert_and_key(s.os_crt, os_key));
    put(&mut machine, "certSANs", strings(&opts.additional_sans));
    put(
        &mut machine,
        "features",
        map(vec![("diskQuotaSupport", true.into())]),
    );
    let mut cluster = Mapping::new();
    put(&mut cluster, "token", b.secrets.bootstraptoken.as_str());
    if control_plane {
        put(
            &mut cluster,
            "etcd",
            map(vec![("ca", cert_and_key(s.etcd_crt, &b.certs.etcd.key))]),
        );
    }
    let mut v1 = Mapping::new();
    put(&mut v1, "version", "v1alpha1");
    put(&mut v1, "debug", false);
    put(&mut v1, "persist", true);
    put(&mut v1, "machine", Value::Mapping(machine));
    put(&mut v1, "cluster", Value::Mapping(cluster));

    let mut docs = vec![
        Value::Mapping(v1),
        document(
            "DiscoveryServiceConfig",
            vec![
                ("name", "default".into()),
                ("endpoint", DISCOVERY_SERVICE_ENDPOINT.into()),
            ],
        ),
        document(
            "DiscoveryIdentityConfig",
            vec![
                ("clusterID", b.cluster.id.as_str().into()),
                ("clusterSecret", b.cluster.secret.as_str().into()),
            ],
        ),
    ];
    if let Some(disk) = &opts.install_disk {
        // Talos writes this document only when it knows the install disk; it selects the disk
        // by its device path, as `--install-disk` names it.
        let image = opts
            .install_image
            .clone()
            .unwrap_or_else(|| default_install_image(opts.version));
        docs.push(document(
            "UnattendedInstallConfig",
            vec![
                ("installer", map(vec![("image", image.into())])),
                (
                    "provisioning",
                    map(vec![
                        (
                            "diskSelector",
                            map(vec![(
                                "match",
                                format!("disk.dev_path == {}", go_quote(disk.trim())).into(),
                            )]),
                        ),
                        ("wipe", false.into()),
                    ]),
                ),
            ],
        ));
    }
    docs.extend([
        document(
            "ResolverConfig",
            vec![(
                "hostDNS",
                map(vec![
                    ("enabled", true.into()),
                    ("forwardKubeDNSToHost", true.into()),
                ]),
            )],
        ),
        document(
            "VolumeConfig",
            vec![
                ("name", "EPHEMERAL".into()),
                ("mount", map(vec![("secure", true.into())])),
            ],
        ),
        // `DefaultFilesystemTrimInterval` (a week), as Go prints a duration.
        document(
            "FilesystemTrimConfig",
            vec![("interval", "168h0m0s".into())],
        ),
        document(
            "SecurityProfileConfig",
            vec![("workloadIsolation", true.into())],
        ),
        document("HostnameConfig", vec![("auto", "stable".into())]),
        document(
            "KubeClusterConfig",
            vec![
                ("clusterName", opts.cluster_name.trim().into()),
                ("endpoint", endpoint.into()),
            ],
        ),
    ]);
    let mut node = vec![("nodeIP", Value::Mapping(Mapping::new()))];
    if control_plane {
        node.push((
            "labels",
            map(vec![
                (CONTROL_PLANE_ROLE, "".into()),
                (EXCLUDE_FROM_EXTERNAL_LB, "".into()),
            ]),
        ));
        node.push((
            "taints",
            map(vec![(CONTROL_PLANE_ROLE, "NoSchedule".into())]),
        ));
    }
    docs.push(document("KubeNodeConfig", node));
    docs.push(document(
        "KubeletConfig",
        vec![
            ("image", format!("ghcr.io/siderolabs/kubelet:v{k8s}").into()),
            ("config", Value::Mapping(Mapping::new())),
            ("defaultRuntimeSeccompProfileEnabled", true.into()),
        ],
    ));
    docs.push(document(
        "KubeNetworkConfig",
        vec![
            ("dnsDomain", opts.dns_domain.trim().into()),
            ("podSubnets", strings(&opts.pod_subnets)),
            ("serviceSubnets", strings(&opts.service_subnets)),
        ],
    ));
    let k8s_crt = pem_text(s.k8s_crt, "certs.k8s.crt")?;
    docs.push(if control_plane {
        document(
            "KubeAPIServerCAConfig",
            vec![(
                "issuingCA",
                map(vec![
                    ("cert", k8s_crt.into()),
                    ("key", pem_text(&b.certs.k8s.key, "certs.k8s.key")?.into()),
                ]),
            )],
        )
    } else {
        document(
            "KubeAPIServerCAConfig",
            vec![("acceptedCAs", Value::Sequence(vec![k8s_crt.into()]))],
        )
    });
    docs.push(document(
        "KubePrismConfig",
        vec![("port", KUBEPRISM_PORT.into())],
    ));
    if !control_plane {
        return Ok(docs);
    }

    docs.push(document(
        "KubeAggregatorCAConfig",
        vec![(
            "issuingCA",
            map(vec![
                (
                    "cert",
                    pem_text(s.aggregator_crt, "certs.k8saggregator.crt")?.into(),
                ),
                (
                    "key",
                    pem_text(&b.certs.k8saggregator.key, "certs.k8saggregator.key")?.into(),
                ),
            ]),
        )],
    ));
    let admission = pod_security_admission();
    let psa = admission
        .as_sequence()
        .and_then(|l| l.first())
        .and_then(|p| p.get("configuration"))
        .cloned()
        .unwrap_or(Value::Null);
    docs.push(document(
        "KubeAdmissionControlConfig",
        vec![("name", "PodSecurity".into()), ("configuration", psa)],
    ));
    docs.push(document(
        "KubeAuditPolicyConfig",
        vec![("configuration", audit_policy())],
    ));
    let health = |p: &str| map(vec![("path", p.into())]);
    docs.push(document(
        "KubeAuthenticationConfig",
        vec![(
            "configuration",
            map(vec![
                (
                    "anonymous",
                    map(vec![
                        (
                            "conditions",
                            Value::Sequence(vec![
                                health("/livez"),
                                health("/readyz"),
                                health("/healthz"),
                            ]),
                        ),
                        ("enabled", true.into()),
                    ]),
                ),
                ("jwt", Value::Sequence(Vec::new())),
            ]),
        )],
    ));
    for (name, kind) in [("node", "Node"), ("rbac", "RBAC")] {
        docs.push(document(
            "KubeAuthorizerConfig",
            vec![("name", name.into()), ("type", kind.into())],
        ));
    }
    // Encryption at rest of Secrets with the bundle's key, named as Talos before 1.14 rendered it
    // for kube-apiserver (`key2` secretbox, `key1` AES-CBC), so a cluster whose configs are
    // regenerated keeps decrypting what it wrote. Talos' 1.14 generator writes a bundle's
    // AES-CBC key under a `secretbox` provider; Plinth writes `aescbc`, which is what the
    // rendered kube-apiserver configuration used for that key until 1.14.
    let key = |name: &str, secret: &str| {
        map(vec![(
            "keys",
            Value::Sequence(vec![map(vec![
                ("name", name.into()),
                ("secret", secret.into()),
            ])]),
        )])
    };
    let mut providers = Vec::new();
    if !b.secrets.secretboxencryptionsecret.is_empty() {
        providers.push(map(vec![(
            "secretbox",
            key("key2", &b.secrets.secretboxencryptionsecret),
        )]));
    }
    if !b.secrets.aescbcencryptionsecret.is_empty() {
        providers.push(map(vec![(
            "aescbc",
            key("key1", &b.secrets.aescbcencryptionsecret),
        )]));
    }
    docs.push(document(
        "KubeEtcdEncryptionConfig",
        vec![(
            "config",
            map(vec![(
                "resources",
                Value::Sequence(vec![map(vec![
                    ("providers", Value::Sequence(providers)),
                    ("resources", Value::Sequence(vec!["secrets".into()])),
                ])]),
            )]),
        )],
    ));
    docs.push(document(
        "KubeServiceAccountConfig",
        vec![(
            "issuer",
            map(vec![
                (
                    "privateKey",
                    pem_text(
                        &b.certs.k8sserviceaccount.key,
                        "certs.k8sserviceaccount.key",
                    )?
                    .into(),
                ),
                ("issuerURL", endpoint.into()),
            ]),
        )],
    ));
    let mut api = vec![(
        "image",
        format!("registry.k8s.io/kube-apiserver:v{k8s}").into(),
    )];
    if !opts.additional_sans.is_empty() {
        api.push(("certExtraSANs", strings(&opts.additional_sans)));
    }
    docs.push(document("KubeAPIServerConfig", api));
    docs.push(document(
        "KubeControllerManagerConfig",
        vec![(
            "image",
            format!("registry.k8s.io/kube-controller-manager:v{k8s}").into(),
        )],
    ));
    for (kind, image) in [
        ("KubeSchedulerConfig", "kube-scheduler"),
        ("KubeProxyConfig", "kube-proxy"),
    ] {
        docs.push(document(
            kind,
            vec![
                ("image", format!("registry.k8s.io/{image}:v{k8s}").into()),
                ("config", Value::Mapping(Mapping::new())),
            ],
        ));
    }
    docs.push(document(
        "KubeFlannelCNIConfig",
        vec![
            ("backendType", "vxlan".into()),
            ("backendPort", 4789u64.into()),
        ],
    ));
    docs.push(document(
        "KubeCoreDNSConfig",
        vec![("enabled", true.into())],
    ));
    Ok(docs)
}

/// A string as Go's `%q` quotes it, for the printable ASCII a device path holds (other bytes are
/// escaped as `\xNN`, which CEL reads the same way).
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for b in s.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('"');
    out
}

fn put(m: &mut Mapping, key: &str, value: impl Into<Value>) {
    m.insert(Value::String(key.to_string()), value.into());
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    let mut m = Mapping::new();
    for (k, v) in entries {
        put(&mut m, k, v);
    }
    Value::Mapping(m)
}

fn strings(items: &[String]) -> Value {
    Value::Sequence(items.iter().cloned().map(Value::String).collect())
}

fn cert_and_key(crt: &str, key: &str) -> Value {
    map(vec![("crt", crt.into()), ("key", key.into())])
}

fn machine_section(
    s: &Secrets<'_>,
    control_plane: bool,
    k8s: &str,
    opts: &GenerateOptions,
    shape: Shape,
) -> Value {
    let b = s.bundle;
    let mut m = Mapping::new();
    put(
        &mut m,
        "type",
        if control_plane {
            "controlplane"
        } else {
            "worker"
        },
    );
    put(&mut m, "token", b.trustdinfo.token.as_str());
    // Workers trust the Talos API CA but cannot issue from it.
    let os_key = if control_plane {
        b.certs.os.key.as_str()
    } else {
        ""
    };
    put(&mut m, "ca", cert_and_key(s.os_crt, os_key));
    put(&mut m, "certSANs", strings(&opts.additional_sans));
    put(
        &mut m,
        "kubelet",
        map(vec![
            ("image", format!("ghcr.io/siderolabs/kubelet:v{k8s}").into()),
            ("defaultRuntimeSeccompProfileEnabled", true.into()),
            ("disableManifestsDirectory", true.into()),
        ]),
    );
    if shape.empty_machine_network {
        put(&mut m, "network", Mapping::new());
    }
    let mut install = Mapping::new();
    if let Some(disk) = &opts.install_disk {
        put(&mut install, "disk", disk.as_str());
    }
    let image = opts
        .install_image
        .clone()
        .unwrap_or_else(|| default_install_image(opts.version));
    put(&mut install, "image", image);
    put(&mut install, "wipe", false);
    if shape.grub_uki_cmdline {
        put(&mut install, "grubUseUKICmdline", true);
    }
    put(&mut m, "install", install);

    let mut features = Mapping::new();
    if shape.legacy_features {
        put(&mut features, "rbac", true);
        put(&mut features, "stableHostname", true);
        put(&mut features, "apidCheckExtKeyUsage", true);
    }
    put(&mut features, "diskQuotaSupport", true);
    put(
        &mut features,
        "kubePrism",
        map(vec![
            ("enabled", true.into()),
            ("port", KUBEPRISM_PORT.into()),
        ]),
    );
    put(
        &mut features,
        "hostDNS",
        map(vec![
            ("enabled", true.into()),
            ("forwardKubeDNSToHost", true.into()),
        ]),
    );
    put(&mut m, "features", features);
    if control_plane {
        put(
            &mut m,
            "nodeLabels",
            map(vec![(EXCLUDE_FROM_EXTERNAL_LB, "".into())]),
        );
    }
    Value::Mapping(m)
}

fn cluster_section(
    s: &Secrets<'_>,
    control_plane: bool,
    k8s: &str,
    host: &str,
    opts: &GenerateOptions,
    shape: Shape,
) -> Value {
    let b = s.bundle;
    let mut c = Mapping::new();
    put(&mut c, "id", b.cluster.id.as_str());
    put(&mut c, "secret", b.cluster.secret.as_str());
    put(
        &mut c,
        "controlPlane",
        map(vec![("endpoint", opts.endpoint.trim().into())]),
    );
    put(&mut c, "clusterName", opts.cluster_name.trim());
    put(
        &mut c,
        "network",
        map(vec![
            ("dnsDomain", opts.dns_domain.trim().into()),
            ("podSubnets", strings(&opts.pod_subnets)),
            ("serviceSubnets", strings(&opts.service_subnets)),
        ]),
    );
    put(&mut c, "token", b.secrets.bootstraptoken.as_str());
    let discovery = map(vec![
        ("enabled", true.into()),
        (
            "registries",
            map(vec![
                ("kubernetes", map(vec![("disabled", true.into())])),
                ("service", Value::Mapping(Mapping::new())),
            ]),
        ),
    ]);
    if !control_plane {
        // Workers verify the Kubernetes CA; its key and the other control-plane secrets stay
        // on control planes.
        put(&mut c, "ca", cert_and_key(s.k8s_crt, ""));
        put(&mut c, "discovery", discovery);
        return Value::Mapping(c);
    }
    // Whichever key the bundle holds, as Talos' generator copies both (an empty one is omitted).
    if !b.secrets.secretboxencryptionsecret.is_empty() {
        put(
            &mut c,
            "secretboxEncryptionSecret",
            b.secrets.secretboxencryptionsecret.as_str(),
        );
    } else {
        put(
            &mut c,
            "aescbcEncryptionSecret",
            b.secrets.aescbcencryptionsecret.as_str(),
        );
    }
    put(&mut c, "ca", cert_and_key(s.k8s_crt, &b.certs.k8s.key));
    put(
        &mut c,
        "aggregatorCA",
        cert_and_key(s.aggregator_crt, &b.certs.k8saggregator.key),
    );
    put(
        &mut c,
        "serviceAccount",
        map(vec![("key", b.certs.k8sserviceaccount.key.as_str().into())]),
    );

    let mut api = Mapping::new();
    put(
        &mut api,
        "image",
        format!("registry.k8s.io/kube-apiserver:v{k8s}"),
    );
    let mut sans = Vec::new();
    if shape.legacy_features {
        sans.push(host.to_string());
    }
    sans.extend(opts.additional_sans.iter().cloned());
    if !sans.is_empty() {
        put(&mut api, "certSANs", strings(&sans));
    }
    if shape.legacy_features {
        put(&mut api, "disablePodSecurityPolicy", true);
    }
    put(&mut api, "admissionControl", pod_security_admission());
    put(&mut api, "auditPolicy", audit_policy());
    put(&mut c, "apiServer", api);
    for (section, image) in [
        ("controllerManager", "kube-controller-manager"),
        ("proxy", "kube-proxy"),
        ("scheduler", "kube-scheduler"),
    ] {
        put(
            &mut c,
            section,
            map(vec![(
                "image",
                format!("registry.k8s.io/{image}:v{k8s}").into(),
            )]),
        );
    }
    put(&mut c, "discovery", discovery);
    put(
        &mut c,
        "etcd",
        map(vec![("ca", cert_and_key(s.etcd_crt, &b.certs.etcd.key))]),
    );
    Value::Mapping(c)
}

/// The audit policy Talos writes by default: everything at `Metadata` level.
fn audit_policy() -> Value {
    map(vec![
        ("apiVersion", "audit.k8s.io/v1".into()),
        ("kind", "Policy".into()),
        (
            "rules",
            Value::Sequence(vec![map(vec![("level", "Metadata".into())])]),
        ),
    ])
}

/// Pod Security admission defaults Talos writes: enforce `baseline`, audit and warn
/// `restricted`, `kube-system` exempt.
fn pod_security_admission() -> Value {
    let defaults = map(vec![
        ("audit", "restricted".into()),
        ("audit-version", "latest".into()),
        ("enforce", "baseline".into()),
        ("enforce-version", "latest".into()),
        ("warn", "restricted".into()),
        ("warn-version", "latest".into()),
    ]);
    let exemptions = map(vec![
        ("namespaces", Value::Sequence(vec!["kube-system".into()])),
        ("runtimeClasses", Value::Sequence(Vec::new())),
        ("usernames", Value::Sequence(Vec::new())),
    ]);
    let configuration = map(vec![
        (
            "apiVersion",
            "pod-security.admission.config.k8s.io/v1alpha1".into(),
        ),
        ("defaults", defaults),
        ("exemptions", exemptions),
        ("kind", "PodSecurityConfiguration".into()),
    ]);
    Value::Sequence(vec![map(vec![
        ("name", "PodSecurity".into()),
        ("configuration", configuration),
    ])])
}

/// The host of an `https://host[:port][/path]` endpoint (IPv6 without brackets), as Go's
/// `url.Hostname` gives it.
fn endpoint_host(endpoint: &str) -> Result<String, GenerateError> {
    let bad = |reason: &str| GenerateError::Option {
        field: "endpoint",
        reason: format!("`{endpoint}` {reason}; expected e.g. https://10.0.0.10:6443"),
    };
    let rest = endpoint
        .trim()
        .strip_prefix("https://")
        .ok_or_else(|| bad("is not an https:// URL"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(bad("must not carry credentials"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| bad("has an unclosed IPv6 bracket"))?;
        if h.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad("has an invalid IPv6 address"));
        }
        match after {
            "" => (h, None),
            a => (
                h,
                Some(
                    a.strip_prefix(':')
                        .ok_or_else(|| bad("has junk after the IPv6 address"))?,
                ),
            ),
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(bad("has no valid host"));
    }
    if let Some(p) = port {
        if !matches!(p.parse::<u16>(), Ok(n) if n > 0) {
            return Err(bad("has a port that is not 1-65535"));
        }
    }
    Ok(host.to_string())
}

fn check_kubernetes_version(v: &str) -> Result<(), GenerateError> {
    let core = v.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()) {
        return Ok(());
    }
    Err(GenerateError::Option {
        field: "kubernetes_version",
        reason: format!("`{v}` is not a Kubernetes version such as 1.34.1"),
    })
}

fn check_subnets(field: &'static str, subnets: &[String]) -> Result<(), GenerateError> {
    if subnets.is_empty() {
        return Err(GenerateError::Option {
            field,
            reason: "at least one network is required".into(),
        });
    }
    for s in subnets {
        if s.parse::<ipnet::IpNet>().is_err() {
            return Err(GenerateError::Option {
                field,
                reason: format!("`{s}` is not a network in CIDR notation such as 10.244.0.0/16"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::talos::disk::{plan_install_disk, DiskRules};
    use crate::talos::patch::load_patch;
    use crate::talos::render::{render, Layer, MachineFacts, RenderInput};
    use crate::talos::validate::{check_semantics, validate, SchemaValidator, Severity};
    use std::path::{Path, PathBuf};

    fn shared(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/talos")
            .join(rel)
    }

    fn bundle() -> SecretsBundle {
        let text = std::fs::read_to_string(shared("configs/secrets.yaml")).expect("secrets.yaml");
        SecretsBundle::parse(&text).expect("bundle")
    }

    /// (release, schema file) of every supported minor.
    const RELEASES: &[(&str, &str)] = &[
        ("v1.11.6", "schemas/config.schema.v1.11.6.json"),
        ("v1.12.11", "schemas/config.schema.v1.12.11.json"),
        ("v1.13.9", "schemas/config.schema.v1.13.9.json"),
    ];
    const ROLES: [Role; 2] = [Role::ControlPlane, Role::Worker];

    fn v(s: &str) -> TalosVersion {
        s.parse().expect("version")
    }

    fn opts(version: TalosVersion) -> GenerateOptions {
        GenerateOptions {
            install_disk: Some("/dev/sda".into()),
            ..GenerateOptions::new("test", "https://1.2.3.4:6443", version)
        }
    }

    fn schema(file: &str, version: TalosVersion) -> SchemaValidator {
        SchemaValidator::load(&shared(file), version).expect("schema")
    }

    fn at<'a>(doc: &'a Value, path: &str) -> &'a Value {
        path.split('.').fold(doc, |node, k| &node[k])
    }

    fn text<'a>(doc: &'a Value, path: &str) -> &'a str {
        at(doc, path)
            .as_str()
            .unwrap_or_else(|| panic!("{path} is not a string"))
    }

    #[test]
    fn generated_configs_validate_for_every_release_and_role() {
        let b = bundle();
        for (release, file) in RELEASES {
            let version = v(release);
            let schema = schema(file, version);
            for role in ROLES {
                let cfg = generate(&b, role, &opts(version)).expect("generate");
                let errors: Vec<String> = schema
                    .check(&cfg)
                    .into_iter()
                    .chain(check_semantics(&cfg, version))
                    .filter(|x| x.severity == Severity::Error)
                    .map(|x| x.to_string())
                    .collect();
                assert!(errors.is_empty(), "{release} {role}: {errors:#?}");
                // The YAML text reads back as the same config.
                let again = MachineConfig::parse(&cfg.to_yaml().expect("yaml")).expect("reparse");
                assert_eq!(again, cfg, "{release} {role}");

                // Without an install disk only the disk is missing: render adds it.
                let no_disk = generate(
                    &b,
                    role,
                    &GenerateOptions::new("test", "https://1.2.3.4:6443", version),
                )
                .expect("generate");
                let report = validate(&no_disk, &schema).expect_err("no disk");
                let paths: Vec<&str> = report.errors.iter().map(|e| e.path.as_str()).collect();
                assert_eq!(paths, ["machine.install"], "{release} {role}");
            }
        }
    }

    #[test]
    fn the_shape_follows_the_release() {
        let b = bundle();
        // (release, role, path, expected value or None for absent)
        let table: &[(&str, Role, &str, Option<&str>)] = &[
            (
                "v1.11.6",
                Role::ControlPlane,
                "machine.features.rbac",
                Some("true"),
            ),
            (
                "v1.11.6",
                Role::Worker,
                "machine.features.stableHostname",
                Some("true"),
            ),
            (
                "v1.11.6",
                Role::ControlPlane,
                "machine.features.apidCheckExtKeyUsage",
                Some("true"),
            ),
            (
                "v1.11.6",
                Role::ControlPlane,
                "cluster.apiServer.disablePodSecurityPolicy",
                Some("true"),
            ),
            (
                "v1.11.6",
                Role::ControlPlane,
                "cluster.apiServer.certSANs",
                Some("[1.2.3.4]"),
            ),
            (
                "v1.11.6",
                Role::ControlPlane,
                "machine.install.grubUseUKICmdline",
                None,
            ),
            ("v1.11.6", Role::Worker, "machine.network", Some("{}")),
            (
                "v1.11.6",
                Role::ControlPlane,
                "machine.kubelet.image",
                Some("ghcr.io/siderolabs/kubelet:v1.34.1"),
            ),
            (
                "v1.11.6",
                Role::ControlPlane,
                "machine.install.image",
                Some("ghcr.io/siderolabs/installer:v1.11.6"),
            ),
            (
                "v1.12.11",
                Role::ControlPlane,
                "machine.features.rbac",
                None,
            ),
            (
                "v1.12.11",
                Role::Worker,
                "machine.features.stableHostname",
                None,
            ),
            (
                "v1.12.11",
                Role::ControlPlane,
                "cluster.apiServer.disablePodSecurityPolicy",
                None,
            ),
            (
                "v1.12.11",
                Role::ControlPlane,
                "cluster.apiServer.certSANs",
                None,
            ),
            (
                "v1.12.11",
                Role::Worker,
                "machine.install.grubUseUKICmdline",
                Some("true"),
            ),
            ("v1.12.11", Role::Worker, "machine.network", Some("{}")),
            (
                "v1.12.11",
                Role::ControlPlane,
                "cluster.apiServer.image",
                Some("registry.k8s.io/kube-apiserver:v1.35.4"),
            ),
            ("v1.13.9", Role::ControlPlane, "machine.network", None),
            ("v1.13.9", Role::Worker, "machine.network", None),
            (
                "v1.13.9",
                Role::ControlPlane,
                "machine.features.kubePrism",
                Some("{enabled: true, port: 7445}"),
            ),
            (
                "v1.13.9",
                Role::Worker,
                "machine.features.hostDNS",
                Some("{enabled: true, forwardKubeDNSToHost: true}"),
            ),
            (
                "v1.13.9",
                Role::ControlPlane,
                "machine.nodeLabels",
                Some("{node.kubernetes.io/exclude-from-external-load-balancers: ''}"),
            ),
            ("v1.13.9", Role::Worker, "machine.nodeLabels", None),
            ("v1.13.9", Role::Worker, "cluster.clusterName", Some("test")),
            (
                "v1.13.9",
                Role::Worker,
                "cluster.discovery",
                Some("{enabled: true, registries: {kubernetes: {disabled: true}, service: {}}}"),
            ),
            (
                "v1.13.9",
                Role::ControlPlane,
                "cluster.proxy.image",
                Some("registry.k8s.io/kube-proxy:v1.36.3"),
            ),
        ];
        for (release, role, path, want) in table {
            let cfg = generate(&b, *role, &opts(v(release))).expect("generate");
            let doc = cfg.v1alpha1().expect("v1alpha1");
            let mut node = Some(doc);
            for k in path.split('.') {
                node = node.and_then(|n| n.get(k));
            }
            let want: Option<Value> = want.map(|w| serde_yaml_ng::from_str(w).expect("want"));
            assert_eq!(node, want.as_ref(), "{release} {role} {path}");
        }
        for (release, _) in RELEASES {
            let cfg = generate(&b, Role::Worker, &opts(v(release))).expect("generate");
            let kinds: Vec<Option<&str>> = cfg
                .documents()
                .iter()
                .map(|d| d.get("kind").and_then(Value::as_str))
                .collect();
            let want: &[Option<&str>] = if *release == "v1.11.6" {
                &[None]
            } else {
                &[None, Some("HostnameConfig")]
            };
            assert_eq!(kinds, want, "{release}");
            if let Some(h) = cfg.documents().get(1) {
                assert_eq!(h["auto"].as_str(), Some("stable"));
            }
        }
    }

    /// Every secret the bundle holds, by (config path, bundle value), and whether a worker may
    /// carry it.
    fn secret_fields(b: &SecretsBundle) -> Vec<(&'static str, String, bool)> {
        let crt = |c: &crate::talos::secrets::CertAndKey| c.crt.clone().expect("crt");
        vec![
            ("machine.token", b.trustdinfo.token.clone(), true),
            ("machine.ca.crt", crt(&b.certs.os), true),
            ("machine.ca.key", b.certs.os.key.clone(), false),
            ("cluster.id", b.cluster.id.clone(), true),
            ("cluster.secret", b.cluster.secret.clone(), true),
            ("cluster.token", b.secrets.bootstraptoken.clone(), true),
            (
                "cluster.secretboxEncryptionSecret",
                b.secrets.secretboxencryptionsecret.clone(),
                false,
            ),
            ("cluster.ca.crt", crt(&b.certs.k8s), true),
            ("cluster.ca.key", b.certs.k8s.key.clone(), false),
            (
                "cluster.aggregatorCA.crt",
                crt(&b.certs.k8saggregator),
                false,
            ),
            (
                "cluster.aggregatorCA.key",
                b.certs.k8saggregator.key.clone(),
                false,
            ),
            (
                "cluster.serviceAccount.key",
                b.certs.k8sserviceaccount.key.clone(),
                false,
            ),
            ("cluster.etcd.ca.crt", crt(&b.certs.etcd), false),
            ("cluster.etcd.ca.key", b.certs.etcd.key.clone(), false),
        ]
    }

    #[test]
    fn control_planes_carry_the_bundle_and_workers_no_private_keys() {
        let b = bundle();
        for (release, _) in RELEASES {
            let version = v(release);
            let cp = generate(&b, Role::ControlPlane, &opts(version)).expect("cp");
            let worker = generate(&b, Role::Worker, &opts(version)).expect("worker");
            let cp_doc = cp.v1alpha1().expect("cp doc");
            let w_doc = worker.v1alpha1().expect("worker doc");
            let w_text = worker.to_yaml().expect("yaml");
            for (path, value, worker_may) in secret_fields(&b) {
                assert_eq!(text(cp_doc, path), value, "{release} control plane {path}");
                if worker_may {
                    assert_eq!(text(w_doc, path), value, "{release} worker {path}");
                } else {
                    assert!(
                        !w_text.contains(&value),
                        "{release}: the worker config carries {path}"
                    );
                    let node = at(w_doc, path);
                    assert!(
                        node.is_null() || node.as_str() == Some(""),
                        "{release} worker {path}: {node:?}"
                    );
                }
            }
            for absent in [
                "aggregatorCA",
                "serviceAccount",
                "etcd",
                "secretboxEncryptionSecret",
                "apiServer",
            ] {
                assert!(
                    w_doc["cluster"].get(absent).is_none(),
                    "{release} worker cluster.{absent}"
                );
            }
            assert!(cp_doc["cluster"].get("aescbcEncryptionSecret").is_none());
        }
    }

    /// A bundle holding the secrets of a config, as `talosctl gen secrets
    /// --from-controlplane-config` reads them.
    fn bundle_of(cp: &Value) -> SecretsBundle {
        let s = |path: &str| text(cp, path).to_string();
        let ck = |prefix: &str, with_crt: bool| crate::talos::secrets::CertAndKey {
            crt: with_crt.then(|| s(&format!("{prefix}.crt"))),
            key: s(&format!("{prefix}.key")),
        };
        SecretsBundle {
            cluster: crate::talos::secrets::ClusterIdentity {
                id: s("cluster.id"),
                secret: s("cluster.secret"),
            },
            secrets: crate::talos::secrets::ClusterSecrets {
                bootstraptoken: s("cluster.token"),
                // The fixture predates secretbox (Talos <= 1.2 used aescbc); this bundle is one
                // `talosctl gen secrets` of a later release would write.
                secretboxencryptionsecret: "c2VjcmV0Ym94LWtleS1mb3ItdGhlLWZpeHR1cmUtdGVzdA=="
                    .into(),
                aescbcencryptionsecret: String::new(),
            },
            trustdinfo: crate::talos::secrets::TrustdInfo {
                token: s("machine.token"),
            },
            certs: crate::talos::secrets::Certs {
                etcd: ck("cluster.etcd.ca", true),
                k8s: ck("cluster.ca", true),
                k8saggregator: ck("cluster.aggregatorCA", true),
                k8sserviceaccount: ck("cluster.serviceAccount", false),
                os: ck("machine.ca", true),
            },
        }
    }

    #[test]
    fn secret_fields_match_the_talos_fixture_configs() {
        // The fixtures were generated from their own bundle, not from configs/secrets.yaml:
        // read the bundle back from the control-plane fixture, as talosctl can.
        let read = |f: &str| {
            MachineConfig::parse(&std::fs::read_to_string(shared(f)).expect("fixture"))
                .expect("parse")
        };
        let cp_fixture = read("configs/controlplane.v1.11.yaml");
        let w_fixture = read("configs/worker.v1.11.yaml");
        let cp_want = cp_fixture.v1alpha1().expect("cp");
        let w_want = w_fixture.v1alpha1().expect("worker");
        let b = bundle_of(cp_want);
        let o = GenerateOptions::new("test", "https://1.2.3.4:6443", v("v1.11.6"));
        let cp = generate(&b, Role::ControlPlane, &o).expect("cp");
        let worker = generate(&b, Role::Worker, &o).expect("worker");
        let cp_got = cp.v1alpha1().expect("cp");
        let w_got = worker.v1alpha1().expect("worker");
        for path in [
            "machine.token",
            "machine.ca",
            "cluster.id",
            "cluster.secret",
            "cluster.token",
            "cluster.ca",
            "cluster.aggregatorCA",
            "cluster.serviceAccount",
            "cluster.etcd.ca",
            "cluster.controlPlane.endpoint",
            "cluster.clusterName",
            "cluster.network",
        ] {
            assert_eq!(at(cp_got, path), at(cp_want, path), "control plane {path}");
        }
        // The worker fixture predates machine.ca on workers; the rest matches as written.
        for path in [
            "machine.token",
            "cluster.id",
            "cluster.secret",
            "cluster.token",
            "cluster.ca",
            "cluster.controlPlane.endpoint",
            "cluster.network",
        ] {
            assert_eq!(at(w_got, path), at(w_want, path), "worker {path}");
        }
        assert_eq!(
            text(w_got, "machine.ca.crt"),
            text(cp_want, "machine.ca.crt")
        );
        assert_eq!(text(w_got, "machine.ca.key"), "");
        // Talos > 1.2 encrypts with secretbox: the bundle's key, never the fixture's aescbc one.
        assert_eq!(
            text(cp_got, "cluster.secretboxEncryptionSecret"),
            b.secrets.secretboxencryptionsecret
        );
        assert!(cp_got["cluster"].get("aescbcEncryptionSecret").is_none());
    }

    #[test]
    fn rendered_configs_still_validate() {
        let b = bundle();
        let disks = vec![crate::domain::Disk {
            serial: Some("S3Z9NB0K".into()),
            size_bytes: Some(480_000_000_000),
            disk_type: Some(crate::domain::DiskType::Ssd),
            ..Default::default()
        }];
        let rules: DiskRules = serde_yaml_ng::from_str("type: ssd").expect("rules");
        let layers = [
            Layer {
                name: "cluster".into(),
                patches: vec![load_patch(
                    "cluster:\n  allowSchedulingOnControlPlanes: true\nmachine:\n  kubelet:\n    extraArgs:\n      rotate-server-certificates: 'true'\n",
                )
                .expect("patch")],
            },
            Layer {
                name: "machine".into(),
                patches: vec![load_patch("machine:\n  certSANs: [node-01.example.net]\n")
                    .expect("patch")],
            },
        ];
        for (release, file) in RELEASES {
            let version = v(release);
            let schema = schema(file, version);
            for role in ROLES {
                // No install disk in the base: the machine's facts supply it.
                let base = generate(
                    &b,
                    role,
                    &GenerateOptions::new("test", "https://1.2.3.4:6443", version),
                )
                .expect("generate");
                let facts = MachineFacts {
                    hostname: Some("node-01".into()),
                    install_disk: Some(plan_install_disk(&rules, &disks, version).expect("plan")),
                    ..Default::default()
                };
                let out = render(&RenderInput {
                    version,
                    base: &base,
                    layers: &layers,
                    facts: &facts,
                })
                .expect("render");
                if let Err(report) = validate(&out.config, &schema) {
                    panic!("{release} {role}: {report}");
                }
                let doc = out.config.v1alpha1().expect("doc");
                assert_eq!(
                    doc["machine"]["install"]["diskSelector"]["serial"].as_str(),
                    Some("S3Z9NB0K"),
                    "{release} {role}"
                );
                assert_eq!(
                    doc["machine"]["certSANs"],
                    serde_yaml_ng::from_str::<Value>("[node-01.example.net]").expect("v")
                );
                let hostname = if version >= TalosVersion::new(1, 12, 0) {
                    out.config.documents()[1]["hostname"].as_str()
                } else {
                    doc["machine"]["network"]["hostname"].as_str()
                };
                assert_eq!(hostname, Some("node-01"), "{release} {role}");
            }
        }
    }

    #[test]
    fn bad_inputs_are_named_without_secrets() {
        let b = bundle();
        let ok = GenerateOptions::new("test", "https://1.2.3.4:6443", v("v1.12.0"));
        let cases: Vec<(GenerateOptions, &str)> = vec![
            (
                GenerateOptions {
                    version: v("v1.10.9"),
                    ..ok.clone()
                },
                "not supported",
            ),
            (
                GenerateOptions {
                    version: v("v1.15.0"),
                    ..ok.clone()
                },
                "not supported",
            ),
            (
                GenerateOptions {
                    endpoint: "http://1.2.3.4:6443".into(),
                    ..ok.clone()
                },
                "endpoint:",
            ),
            (
                GenerateOptions {
                    endpoint: "https://:6443".into(),
                    ..ok.clone()
                },
                "has no valid host",
            ),
            (
                GenerateOptions {
                    endpoint: "https://1.2.3.4:0".into(),
                    ..ok.clone()
                },
                "port",
            ),
            (
                GenerateOptions {
                    cluster_name: " ".into(),
                    ..ok.clone()
                },
                "cluster_name",
            ),
            (
                GenerateOptions {
                    kubernetes_version: Some("latest".into()),
                    ..ok.clone()
                },
                "kubernetes_version",
            ),
            (
                GenerateOptions {
                    pod_subnets: vec!["10.244.0.0".into()],
                    ..ok.clone()
                },
                "pod_subnets",
            ),
            (
                GenerateOptions {
                    service_subnets: vec![],
                    ..ok.clone()
                },
                "service_subnets",
            ),
        ];
        for (o, want) in cases {
            let e = generate(&b, Role::Worker, &o).expect_err(want);
            assert!(e.to_string().contains(want), "{e}");
        }
        let mut partial = b.clone();
        partial.certs.os.crt = None;
        partial.certs.etcd.key.clear();
        let e = generate(&partial, Role::Worker, &ok).expect_err("partial");
        assert_eq!(
            e,
            GenerateError::IncompleteBundle {
                fields: vec!["certs.os.crt", "certs.etcd.key"]
            }
        );
        assert!(!e.to_string().contains(&b.certs.etcd.key));
    }

    #[test]
    fn options_shape_the_config() {
        let b = bundle();
        let o = GenerateOptions {
            kubernetes_version: Some("v1.33.5".into()),
            install_image: Some("factory.talos.dev/metal-installer/abc:v1.12.11".into()),
            additional_sans: vec!["api.example.net".into()],
            dns_domain: "k8s.example.net".into(),
            pod_subnets: vec!["10.128.0.0/14".into(), "fd00:10::/56".into()],
            endpoint: "https://[fd00::10]:6443".into(),
            ..GenerateOptions::new("prod", "", v("v1.12.11"))
        };
        let cfg = generate(&b, Role::ControlPlane, &o).expect("generate");
        let doc = cfg.v1alpha1().expect("doc");
        let yaml = |s: &str| serde_yaml_ng::from_str::<Value>(s).expect("yaml");
        assert_eq!(
            text(doc, "machine.kubelet.image"),
            "ghcr.io/siderolabs/kubelet:v1.33.5"
        );
        assert_eq!(
            text(doc, "cluster.scheduler.image"),
            "registry.k8s.io/kube-scheduler:v1.33.5"
        );
        assert_eq!(
            text(doc, "machine.install.image"),
            "factory.talos.dev/metal-installer/abc:v1.12.11"
        );
        assert_eq!(at(doc, "machine.certSANs"), &yaml("[api.example.net]"));
        assert_eq!(
            at(doc, "cluster.apiServer.certSANs"),
            &yaml("[api.example.net]")
        );
        assert_eq!(
            at(doc, "cluster.network"),
            &yaml("{dnsDomain: k8s.example.net, podSubnets: [10.128.0.0/14, 'fd00:10::/56'], serviceSubnets: [10.96.0.0/12]}")
        );
        assert_eq!(
            text(doc, "cluster.controlPlane.endpoint"),
            "https://[fd00::10]:6443"
        );
        // 1.11 puts the endpoint's host (without brackets) first among the API server SANs.
        let old = generate(
            &b,
            Role::ControlPlane,
            &GenerateOptions {
                version: v("v1.11.6"),
                ..o
            },
        )
        .expect("generate");
        assert_eq!(
            at(old.v1alpha1().expect("doc"), "cluster.apiServer.certSANs"),
            &yaml("['fd00::10', api.example.net]")
        );
    }

    #[test]
    fn kubernetes_defaults_follow_the_talos_patch_release() {
        let table = [
            ("v1.11.0", Some("1.34.0")),
            ("v1.11.2", Some("1.34.1")),
            ("v1.11.6", Some("1.34.1")),
            ("v1.12.4", Some("1.35.0")),
            ("v1.12.6", Some("1.35.2")),
            ("v1.12.11", Some("1.35.4")),
            ("v1.13.2", Some("1.36.0")),
            ("v1.13.4", Some("1.36.1")),
            ("v1.13.8", Some("1.36.2")),
            ("v1.13.12", Some("1.36.3")),
            // v1.14.0-rc.1's default.
            ("v1.14.0", Some("1.37.0-rc.0")),
            ("v1.10.9", None),
            ("v1.15.0", None),
        ];
        for (release, want) in table {
            assert_eq!(default_kubernetes_version(v(release)), want, "{release}");
        }
    }
}

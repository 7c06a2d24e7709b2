//! Talos' own validators, ported as rules over YAML data: the error and warning rules of the
//! v1alpha1 validator (`pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go`), the
//! `Validate()` of multi-document kinds, and the conflict validators between a multi-document
//! kind and the legacy v1alpha1 field it replaces (`V1Alpha1ConflictValidate` in
//! `pkg/machinery/config/types/*/`). Each finding names the Talos source file of its rule and
//! keeps Talos' verdict: an error stays an error, a warning stays a warning. Rules are gated by
//! the Talos minor release that has them. Pure functions; imports nothing outside
//! `crate::talos`.

use std::collections::HashMap;
use std::net::IpAddr;

use serde_yaml_ng::Value;

use super::{kinds, RuleSource, Severity, Violation};
use crate::talos::{DocumentId, MachineConfig, TalosVersion};

/// The v1alpha1 validator of Talos.
pub const V1ALPHA1_RULES: &str = "pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go";

/// Collects findings for one document.
pub(super) struct Findings<'a> {
    out: &'a mut Vec<Violation>,
    document: String,
}

impl<'a> Findings<'a> {
    /// Findings of `document` (as [`DocumentId`] displays it) into `out`.
    pub(super) fn new(out: &'a mut Vec<Violation>, document: String) -> Self {
        Findings { out, document }
    }

    /// How many findings the output holds (of every document).
    pub(super) fn len(&self) -> usize {
        self.out.len()
    }

    fn push(&mut self, severity: Severity, path: &str, rule: &'static str, message: String) {
        self.out.push(Violation {
            document: self.document.clone(),
            path: path.to_string(),
            message,
            source: RuleSource::Talos,
            severity,
            rule,
        });
    }

    pub(super) fn error(&mut self, path: &str, rule: &'static str, message: impl Into<String>) {
        self.push(Severity::Error, path, rule, message.into());
    }

    pub(super) fn warning(&mut self, path: &str, rule: &'static str, message: impl Into<String>) {
        self.push(Severity::Warning, path, rule, message.into());
    }
}

/// The value at a dotted path, if set and not null.
pub(super) fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut node = v;
    for k in path.split('.') {
        node = node.get(k)?;
    }
    (!node.is_null()).then_some(node)
}

pub(super) fn text<'a>(v: &'a Value, path: &str) -> &'a str {
    at(v, path).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn truthy(v: &Value, path: &str) -> bool {
    at(v, path).and_then(Value::as_bool) == Some(true)
}

pub(super) fn items<'a>(v: &'a Value, path: &str) -> &'a [Value] {
    at(v, path)
        .and_then(Value::as_sequence)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

pub(super) fn number(v: &Value, path: &str) -> u64 {
    at(v, path).and_then(Value::as_u64).unwrap_or(0)
}

pub(super) fn set(v: &Value, path: &str) -> bool {
    match at(v, path) {
        None => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Sequence(s)) => !s.is_empty(),
        Some(Value::Mapping(m)) => !m.is_empty(),
        Some(_) => true,
    }
}

/// An address or a subnet (`10.0.0.0/8`, `fd00::1`), as Talos' `ParseSubnetOrAddress` takes.
pub(super) fn subnet_or_address(s: &str) -> bool {
    match s.split_once('/') {
        Some((ip, bits)) => match (ip.parse::<IpAddr>(), bits.parse::<u8>()) {
            (Ok(IpAddr::V4(_)), Ok(b)) => b <= 32,
            (Ok(IpAddr::V6(_)), Ok(b)) => b <= 128,
            _ => false,
        },
        None => s.parse::<IpAddr>().is_ok(),
    }
}

/// A DNS name as Talos' cluster DNS domain rule accepts it: labels of letters, digits, `_` and
/// `-` (not starting with `-`), at most 63 long, at most 255 characters without the dots.
pub(super) fn dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() - name.matches('.').count() > 255 {
        return false;
    }
    let trimmed = name.strip_suffix(['.', '_']).unwrap_or(name);
    !trimmed.is_empty()
        && trimmed.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
}

/// A URL with a scheme and a host (Talos' `ValidateEndpointURI` and `url.ParseRequestURI`).
pub(super) fn endpoint_uri(u: &str) -> bool {
    u.split_once("://").is_some_and(|(scheme, rest)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
            && !rest.is_empty()
            && !rest.starts_with('/')
    })
}

/// The kubelet configuration fields Talos does not let `extraConfig` override
/// (`pkg/machinery/kubelet`).
const KUBELET_PROTECTED: &[&str] = &[
    "apiVersion",
    "authentication",
    "authorization",
    "cgroupRoot",
    "kind",
    "kubeletCgroups",
    "port",
    "protectKernelDefaults",
    "resolvConf",
    "rotateCertificates",
    "systemCgroups",
    "staticPodPath",
    "seccompDefault",
];

/// The Talos API roles a version grants (`pkg/machinery/role/role.go`).
fn roles(version: TalosVersion) -> &'static [&'static str] {
    if version.minor >= 13 {
        &[
            "os:admin",
            "os:operator",
            "os:reader",
            "os:etcd:backup",
            "os:image:verifier",
            "os:meta:writer",
            "os:impersonator",
        ]
    } else {
        &[
            "os:admin",
            "os:operator",
            "os:reader",
            "os:etcd:backup",
            "os:impersonator",
        ]
    }
}

/// The rules of the v1alpha1 validator not covered by `check_semantics` itself.
pub(super) fn check_v1alpha1(
    doc: &Value,
    control_plane: Option<bool>,
    version: TalosVersion,
    out: &mut Vec<Violation>,
) {
    let mut f = Findings {
        out,
        document: "v1alpha1".into(),
    };
    let f = &mut f;
    let r = V1ALPHA1_RULES;

    if at(doc, "persist").and_then(Value::as_bool) == Some(false) {
        f.error("persist", r, ".persist should be enabled");
    }

    if let Some(install) = at(doc, "machine.install") {
        if version.minor >= 12
            && !items(install, "extraKernelArgs").is_empty()
            && truthy(install, "grubUseUKICmdline")
        {
            f.error(
                "machine.install.extraKernelArgs",
                r,
                "install.extraKernelArgs and install.grubUseUKICmdline can't be used together: with grubUseUKICmdline GRUB boots the kernel line built into the UKI, so put the arguments in the schematic's extraKernelArgs",
            );
        }
        let mut seen = HashMap::new();
        let exts = items(install, "extensions");
        for (i, ext) in exts.iter().enumerate() {
            let image = text(ext, "image");
            if seen.insert(image.to_string(), i).is_some() {
                f.error(
                    &format!("machine.install.extensions[{i}].image"),
                    r,
                    format!("duplicate system extension {image:?}"),
                );
            }
        }
        if !exts.is_empty() {
            f.warning(
                "machine.install.extensions",
                r,
                ".machine.install.extensions is deprecated: put system extensions in the Image Factory schematic",
            );
        }
    }

    if version.minor >= 13
        && at(doc, "machine.features.hostDNS").is_some()
        && truthy(doc, "machine.features.hostDNS.forwardKubeDNSToHost")
        && !truthy(doc, "machine.features.hostDNS.enabled")
    {
        f.error(
            "machine.features.hostDNS.forwardKubeDNSToHost",
            r,
            "feature hostDNS.forwardKubeDNSToHost requires hostDNS.enabled to be true",
        );
    }

    if version.minor >= 14 {
        if set(doc, "machine.files") {
            f.warning(
                "machine.files",
                r,
                ".machine.files is deprecated; use dedicated configuration documents instead",
            );
        }
        if set(doc, "machine.baseRuntimeSpecOverrides") {
            f.warning(
                "machine.baseRuntimeSpecOverrides",
                r,
                ".machine.baseRuntimeSpecOverrides is deprecated; use a CRIBaseRuntimeSpecConfig document instead",
            );
        }
    }

    // Cluster section.
    if at(doc, "cluster").is_some() {
        let domain = text(doc, "cluster.network.dnsDomain");
        if !domain.is_empty() && !dns_name(domain) {
            f.error(
                "cluster.network.dnsDomain",
                r,
                format!("{domain:?} is not a valid DNS name"),
            );
        }
        if at(doc, "cluster.externalCloudProvider").is_some() {
            let manifests = items(doc, "cluster.externalCloudProvider.manifests");
            if !truthy(doc, "cluster.externalCloudProvider.enabled") && !manifests.is_empty() {
                f.error(
                    "cluster.externalCloudProvider.manifests",
                    r,
                    "external cloud provider is disabled, but manifests are provided",
                );
            }
            for (i, m) in manifests.iter().enumerate() {
                let u = m.as_str().unwrap_or("");
                if !endpoint_uri(u) {
                    f.error(
                        &format!("cluster.externalCloudProvider.manifests[{i}]"),
                        r,
                        format!("invalid external cloud provider manifest url {u:?}"),
                    );
                }
            }
        }
        if control_plane == Some(true) {
            if let Some(etcd) = at(doc, "cluster.etcd") {
                if set(etcd, "subnet") && set(etcd, "advertisedSubnets") {
                    f.error(
                        "cluster.etcd.subnet",
                        r,
                        "etcd subnet can't be set when advertised subnets are set",
                    );
                }
                for key in ["advertisedSubnets", "listenSubnets"] {
                    for (i, s) in items(etcd, key).iter().enumerate() {
                        let s = s.as_str().unwrap_or("");
                        if !subnet_or_address(s.trim_start_matches('!')) {
                            f.error(
                                &format!("cluster.etcd.{key}[{i}]"),
                                r,
                                format!("etcd subnet is not valid: {s:?}"),
                            );
                        }
                    }
                }
            }
        }
        let mut names = HashMap::new();
        for (i, m) in items(doc, "cluster.inlineManifests").iter().enumerate() {
            let name = text(m, "name");
            if name.trim().is_empty() {
                f.error(
                    &format!("cluster.inlineManifests[{i}].name"),
                    r,
                    "inline manifest name can't be empty",
                );
            }
            if names.insert(name.to_string(), i).is_some() {
                f.error(
                    &format!("cluster.inlineManifests[{i}].name"),
                    r,
                    format!("inline manifest name {name:?} is duplicate"),
                );
            }
        }
        if truthy(doc, "cluster.discovery.enabled")
            && !truthy(doc, "cluster.discovery.registries.service.disabled")
        {
            let ep = text(doc, "cluster.discovery.registries.service.endpoint");
            if !ep.is_empty() {
                if !endpoint_uri(ep) {
                    f.error(
                        "cluster.discovery.registries.service.endpoint",
                        r,
                        format!("cluster discovery service registry endpoint is invalid: {ep:?}"),
                    );
                } else if let Some((_, rest)) = ep.split_once("://") {
                    if rest.split_once('/').is_some_and(|(_, p)| !p.is_empty()) {
                        f.error(
                            "cluster.discovery.registries.service.endpoint",
                            r,
                            "cluster discovery service path should be empty",
                        );
                    }
                }
            }
            if !set(doc, "cluster.id") {
                f.error(
                    "cluster.id",
                    r,
                    "cluster discovery service requires .cluster.id",
                );
            }
            if !set(doc, "cluster.secret") {
                f.error(
                    "cluster.secret",
                    r,
                    "cluster discovery service requires .cluster.secret",
                );
            }
        }
        if control_plane == Some(true) && at(doc, "cluster.network").is_some() {
            check_cni(doc, f);
        }
    }

    // Network devices.
    if at(doc, "machine.network").is_some() {
        check_interfaces(doc, f);
        if truthy(doc, "machine.network.kubespan.enabled") {
            let mtu = number(doc, "machine.network.kubespan.mtu");
            if mtu != 0 && mtu < 1280 {
                f.error(
                    "machine.network.kubespan.mtu",
                    r,
                    "kubespan link MTU must be at least 1280",
                );
            }
        }
    }

    // Disks and disk encryption.
    for (d, disk) in items(doc, "machine.disks").iter().enumerate() {
        if disk.is_null() {
            f.error(
                &format!("machine.disks[{d}]"),
                r,
                format!("machine.disks[{d}] is null"),
            );
            continue;
        }
        let parts = items(disk, "partitions");
        for (i, p) in parts.iter().enumerate() {
            let zero =
                at(p, "size").is_none_or(|s| s.as_u64() == Some(0) || s.as_str() == Some("0"));
            if zero && i + 1 != parts.len() {
                f.error(
                    &format!("machine.disks[{d}].partitions[{i}].size"),
                    r,
                    format!(
                        "partition for disk {:?} is set to occupy full disk, but it's not the last partition in the list",
                        text(disk, "device")
                    ),
                );
            }
        }
    }
    for label in ["ephemeral", "state"] {
        let Some(enc) = at(doc, &format!("machine.systemDiskEncryption.{label}")) else {
            continue;
        };
        let keys = items(enc, "keys");
        let base = format!("machine.systemDiskEncryption.{label}.keys");
        if keys.is_empty() {
            f.error(
                &base,
                r,
                format!("partition {label:?}: no encryption keys provided"),
            );
        }
        let mut slots = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            let slot = number(k, "slot");
            if slots.insert(slot, i).is_some() {
                f.error(
                    &format!("{base}[{i}].slot"),
                    r,
                    format!("partition {label:?}: encryption key slot {slot} is already in use"),
                );
            }
            if !["nodeID", "static", "kms", "tpm"]
                .iter()
                .any(|m| at(k, m).is_some())
            {
                f.error(
                    &format!("{base}[{i}]"),
                    r,
                    format!("partition {label:?}: encryption key at slot {slot} doesn't have the configuration parameters"),
                );
            }
        }
    }

    // Kubelet.
    if let Some(kubelet) = at(doc, "machine.kubelet") {
        for (i, s) in items(kubelet, "nodeIP.validSubnets").iter().enumerate() {
            let s = s.as_str().unwrap_or("");
            if !subnet_or_address(s.trim_start_matches('!')) {
                f.error(
                    &format!("machine.kubelet.nodeIP.validSubnets[{i}]"),
                    r,
                    format!("kubelet nodeIP subnet is not valid: {s:?}"),
                );
            }
        }
        if let Some(extra) = at(kubelet, "extraConfig").and_then(Value::as_mapping) {
            for field in KUBELET_PROTECTED {
                if extra.contains_key(*field) {
                    f.error(
                        &format!("machine.kubelet.extraConfig.{field}"),
                        r,
                        format!("kubelet configuration field {field:?} can't be overridden"),
                    );
                }
            }
        }
    }

    super::v1alpha1::check(doc, control_plane, version, f);

    // Kubernetes access to the Talos API.
    if truthy(doc, "machine.features.kubernetesTalosAPIAccess.enabled") {
        if control_plane == Some(false) {
            f.error(
                "machine.features.kubernetesTalosAPIAccess",
                r,
                "feature Kubernetes Talos API Access can only be enabled on control plane machines",
            );
        }
        let known = roles(version);
        for (i, role) in items(
            doc,
            "machine.features.kubernetesTalosAPIAccess.allowedRoles",
        )
        .iter()
        .enumerate()
        {
            let role = role.as_str().unwrap_or("");
            if !known.contains(&role) {
                f.error(
                    &format!("machine.features.kubernetesTalosAPIAccess.allowedRoles[{i}]"),
                    r,
                    format!(
                        "invalid role {role:?} in allowed roles for Kubernetes Talos API Access"
                    ),
                );
            }
        }
    }
}

/// The CNI rules of a control plane's cluster network.
fn check_cni(doc: &Value, f: &mut Findings<'_>) {
    let r = V1ALPHA1_RULES;
    let Some(cni) = at(doc, "cluster.network.cni") else {
        return;
    };
    let name = text(cni, "name");
    let urls = items(cni, "urls");
    let flannel_args = set(cni, "flannel.extraArgs");
    let policies = truthy(cni, "flannel.kubeNetworkPoliciesEnabled");
    let p = "cluster.network.cni";
    match name {
        "flannel" => {
            if !urls.is_empty() {
                f.error(
                    &format!("{p}.urls"),
                    r,
                    "\"urls\" field should be empty for \"flannel\" CNI",
                );
            }
        }
        "none" | "custom" => {
            if name == "none" && !urls.is_empty() {
                f.error(
                    &format!("{p}.urls"),
                    r,
                    "\"urls\" field should be empty for \"none\" CNI",
                );
            }
            if name == "custom" && urls.is_empty() {
                f.warning(
                    &format!("{p}.urls"),
                    r,
                    "\"urls\" field should not be empty for \"custom\" CNI",
                );
            }
            if flannel_args {
                f.error(
                    &format!("{p}.flannel.extraArgs"),
                    r,
                    format!("\"flanneldExtraArgs\" field should be empty for {name:?} CNI"),
                );
            }
            if policies {
                f.error(
                    &format!("{p}.flannel.kubeNetworkPoliciesEnabled"),
                    r,
                    format!("\"flannelKubeNetworkPoliciesEnabled\" should not be enabled for {name:?} CNI"),
                );
            }
            if name == "custom" {
                for (i, u) in urls.iter().enumerate() {
                    let u = u.as_str().unwrap_or("");
                    if !endpoint_uri(u) {
                        f.error(
                            &format!("{p}.urls[{i}]"),
                            r,
                            format!("invalid CNI manifest URL {u:?}"),
                        );
                    }
                }
            }
        }
        other => f.error(
            &format!("{p}.name"),
            r,
            format!("cni name {other:?} should be one of \"flannel\", \"custom\", \"none\""),
        ),
    }
}

/// The rules of `machine.network.interfaces`.
fn check_interfaces(doc: &Value, f: &mut Findings<'_>) {
    let r = V1ALPHA1_RULES;
    let ifaces = items(doc, "machine.network.interfaces");
    let mut secondary: HashMap<String, String> = HashMap::new();
    for (i, d) in ifaces.iter().enumerate() {
        let p = format!("machine.network.interfaces[{i}]");
        let name = text(d, "interface").to_string();
        let bond = at(d, "bond");
        if bond.is_some() && at(d, "bridge").is_some() {
            f.error(
                &p,
                r,
                format!("interface has both bridge and bond sections set {name:?}: config sections are mutually exclusive"),
            );
        }
        let mut members: Vec<String> = Vec::new();
        if let Some(b) = bond {
            members = items(b, "interfaces")
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            if !members.is_empty() && set(b, "deviceSelectors") {
                f.error(
                    &format!("{p}.bond"),
                    r,
                    format!("interface {name:?} has both interfaces and selectors set: config sections are mutually exclusive"),
                );
            }
        }
        if let Some(br) = at(d, "bridge") {
            members = items(br, "interfaces")
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
        }
        for m in members {
            if let Some(other) = secondary.get(&m) {
                if *other != name {
                    f.error(
                        &p,
                        r,
                        format!("interface {m:?} is declared as part of two separate links: {other:?} and {name:?}"),
                    );
                }
            }
            secondary.insert(m, name.clone());
        }
    }
    for (i, d) in ifaces.iter().enumerate() {
        if truthy(d, "ignore") {
            continue;
        }
        let p = format!("machine.network.interfaces[{i}]");
        let name = text(d, "interface");
        let selector = at(d, "deviceSelector");
        match (name.is_empty(), selector.is_some()) {
            (true, false) => f.error(&p, r, "one of interface or deviceSelector is required"),
            (false, true) => f.error(&p, r, "interface and deviceSelector are mutually exclusive"),
            _ => {}
        }
        if selector.is_some_and(|s| s.as_mapping().is_some_and(|m| m.is_empty())) {
            f.error(
                &format!("{p}.deviceSelector"),
                r,
                "deviceSelector should contain at least one field",
            );
        }
        if let Some(b) = at(d, "bond") {
            let miimon = number(b, "miimon");
            for key in ["updelay", "downdelay"] {
                let delay = number(b, key);
                if miimon == 0 && delay != 0 {
                    f.error(
                        &format!("{p}.bond.{key}"),
                        r,
                        format!("bond.{key} can't be set if miimon is zero"),
                    );
                } else if miimon != 0 && delay % miimon != 0 {
                    f.error(
                        &format!("{p}.bond.{key}"),
                        r,
                        format!("bond.{key} should be a multiple of miimon"),
                    );
                }
            }
        }
        if name.is_empty() || !secondary.contains_key(name) {
            if set(d, "cidr") && set(d, "addresses") {
                f.error(
                    &p,
                    r,
                    format!("{name:?}: interface can't have both .cidr and .addresses set"),
                );
            } else if set(d, "cidr") {
                f.warning(
                    &format!("{p}.cidr"),
                    r,
                    format!("{name:?}: machine.network.interface.cidr is deprecated, please use machine.network.interface.addresses"),
                );
            }
        } else if set(d, "cidr")
            || set(d, "addresses")
            || truthy(d, "dhcp")
            || at(d, "vip").is_some()
        {
            f.error(
                &p,
                r,
                format!("{name:?}: bonded/bridged interface shouldn't have any addressing methods configured"),
            );
        }
    }
}

/// A multi-document kind that replaces a v1alpha1 field: Talos refuses the config when both are
/// set. (kind, v1alpha1 path, what counts as set, Talos file.)
const CONFLICTS: &[(&str, &str, Presence, &str)] = &[
    (
        "HostnameConfig",
        "machine.network.hostname",
        Presence::NonEmpty,
        "pkg/machinery/config/types/network/hostname.go",
    ),
    (
        "HostnameConfig",
        "machine.features.stableHostname",
        Presence::True,
        "pkg/machinery/config/types/network/hostname.go",
    ),
    (
        "CRIBaseRuntimeSpecConfig",
        "machine.baseRuntimeSpecOverrides",
        Presence::Present,
        "pkg/machinery/config/types/cri/base_runtime_spec.go",
    ),
    (
        "DiscoveryServiceConfig",
        "cluster.discovery",
        Presence::Present,
        "pkg/machinery/config/types/cluster/discovery_service.go",
    ),
    (
        "KubeAPIServerConfig",
        "cluster.apiServer",
        Presence::Present,
        "pkg/machinery/config/types/k8s/apiserver.go",
    ),
    (
        "KubeAPIServerCAConfig",
        "cluster.ca",
        Presence::Present,
        "pkg/machinery/config/types/k8s/apiserver_ca.go",
    ),
    (
        "KubeAggregatorCAConfig",
        "cluster.aggregatorCA",
        Presence::Present,
        "pkg/machinery/config/types/k8s/aggregator_ca.go",
    ),
    (
        "KubeServiceAccountConfig",
        "cluster.serviceAccount",
        Presence::Present,
        "pkg/machinery/config/types/k8s/service_account.go",
    ),
    (
        "KubeControllerManagerConfig",
        "cluster.controllerManager",
        Presence::Present,
        "pkg/machinery/config/types/k8s/controller_manager.go",
    ),
    (
        "KubeSchedulerConfig",
        "cluster.scheduler",
        Presence::Present,
        "pkg/machinery/config/types/k8s/scheduler.go",
    ),
    (
        "KubeProxyConfig",
        "cluster.proxy",
        Presence::Present,
        "pkg/machinery/config/types/k8s/proxy.go",
    ),
    (
        "KubeCoreDNSConfig",
        "cluster.coreDNS",
        Presence::Present,
        "pkg/machinery/config/types/k8s/coredns.go",
    ),
    (
        "KubeNetworkConfig",
        "cluster.network",
        Presence::Present,
        "pkg/machinery/config/types/k8s/network.go",
    ),
    (
        "KubeFlannelCNIConfig",
        "cluster.network",
        Presence::Present,
        "pkg/machinery/config/types/k8s/flannel.go",
    ),
    (
        "KubeClusterConfig",
        "cluster.clusterName",
        Presence::NonEmpty,
        "pkg/machinery/config/types/k8s/cluster.go",
    ),
    (
        "KubeletConfig",
        "machine.kubelet",
        Presence::Present,
        "pkg/machinery/config/types/k8s/kubelet.go",
    ),
    (
        "KubeCredentialProviderConfig",
        "machine.kubelet",
        Presence::Present,
        "pkg/machinery/config/types/k8s/credential_provider.go",
    ),
    (
        "KubePrismConfig",
        "machine.features.kubePrism",
        Presence::Present,
        "pkg/machinery/config/types/k8s/kubeprism.go",
    ),
    (
        "KubeTalosAPIAccessConfig",
        "machine.features.kubernetesTalosAPIAccess",
        Presence::Present,
        "pkg/machinery/config/types/k8s/talos_api_access.go",
    ),
    (
        "KubeAdmissionControlConfig",
        "cluster.apiServer.admissionControl",
        Presence::NonEmpty,
        "pkg/machinery/config/types/k8s/admission_control.go",
    ),
    (
        "KubeEtcdEncryptionConfig",
        "cluster.secretboxEncryptionSecret",
        Presence::NonEmpty,
        "pkg/machinery/config/types/k8s/etcd_encryption.go",
    ),
    (
        "KubeEtcdEncryptionConfig",
        "cluster.aescbcEncryptionSecret",
        Presence::NonEmpty,
        "pkg/machinery/config/types/k8s/etcd_encryption.go",
    ),
    (
        "KubeAPIServerConfig",
        "cluster.controlPlane.localAPIServerPort",
        Presence::NonZero,
        "pkg/machinery/config/types/k8s/apiserver.go",
    ),
    (
        "KubeControllerManagerConfig",
        "machine.controlPlane.controllerManager",
        Presence::Present,
        "pkg/machinery/config/types/k8s/controller_manager.go",
    ),
    (
        "KubeSchedulerConfig",
        "machine.controlPlane.scheduler",
        Presence::Present,
        "pkg/machinery/config/types/k8s/scheduler.go",
    ),
    (
        "KubeClusterConfig",
        "cluster.controlPlane.endpoint",
        Presence::Present,
        "pkg/machinery/config/types/k8s/cluster.go",
    ),
    (
        "KubeAuthorizerConfig",
        "cluster.apiServer.admissionControl",
        Presence::NonEmpty,
        "pkg/machinery/config/types/k8s/authorization.go",
    ),
    (
        "KubeAuditPolicyConfig",
        "cluster.apiServer.auditPolicy",
        Presence::NonEmpty,
        "pkg/machinery/config/types/k8s/audit_policy.go",
    ),
    (
        "DiscoveryIdentityConfig",
        "cluster.id",
        Presence::NonEmpty,
        "pkg/machinery/config/types/cluster/discovery_identity.go",
    ),
    (
        "DiscoveryIdentityConfig",
        "cluster.secret",
        Presence::NonEmpty,
        "pkg/machinery/config/types/cluster/discovery_identity.go",
    ),
    (
        "ImageCacheConfig",
        "machine.features.imageCache",
        Presence::Present,
        "pkg/machinery/config/types/cri/image_cache.go",
    ),
    (
        "KubeNodeConfig",
        "cluster.allowSchedulingOnControlPlanes",
        Presence::Present,
        "pkg/machinery/config/types/k8s/node.go",
    ),
    (
        "KubeNodeConfig",
        "cluster.allowSchedulingOnMasters",
        Presence::Present,
        "pkg/machinery/config/types/k8s/node.go",
    ),
    (
        "KubeNodeConfig",
        "machine.kubelet.skipNodeRegistration",
        Presence::Present,
        "pkg/machinery/config/types/k8s/node.go",
    ),
    (
        "KubeNodeConfig",
        "machine.kubelet.registerWithFQDN",
        Presence::Present,
        "pkg/machinery/config/types/k8s/node.go",
    ),
    (
        "KubeNodeConfig",
        "machine.kubelet.nodeIP",
        Presence::Present,
        "pkg/machinery/config/types/k8s/node.go",
    ),
    (
        "KubeNodeConfig",
        "machine.nodeLabels",
        Presence::Present,
        "pkg/machinery/config/types/k8s/node.go",
    ),
    (
        "KubeNodeConfig",
        "machine.nodeAnnotations",
        Presence::Present,
        "pkg/machinery/config/types/k8s/node.go",
    ),
    (
        "KubeNodeConfig",
        "machine.nodeTaints",
        Presence::Present,
        "pkg/machinery/config/types/k8s/node.go",
    ),
];

/// What makes a v1alpha1 field count as set for a conflict.
#[derive(Clone, Copy, Debug)]
enum Presence {
    /// The key is there (even empty).
    Present,
    /// Not empty.
    NonEmpty,
    /// `true`.
    True,
    /// A number other than 0.
    NonZero,
}

/// The conflict validators and the multi-document kinds' own rules.
pub(super) fn check_documents(config: &MachineConfig, out: &mut Vec<Violation>) {
    let v1 = config.v1alpha1();
    for d in config.documents() {
        let Some(id) = DocumentId::of(d) else {
            continue;
        };
        if id.is_v1alpha1() {
            continue;
        }
        if id.kind == "HostnameConfig" {
            let mut f = Findings {
                out: &mut *out,
                document: id.to_string(),
            };
            check_hostname_config(d, &mut f);
        }
        let Some(v1) = v1 else {
            continue;
        };
        let mut f = Findings {
            out: &mut *out,
            document: "v1alpha1".into(),
        };
        check_conflicts(&id, d, v1, &mut f);
        for (kind, path, presence, rule) in CONFLICTS {
            if *kind != id.kind {
                continue;
            }
            let hit = match presence {
                Presence::Present => at(v1, path).is_some(),
                Presence::NonEmpty => set(v1, path),
                Presence::True => truthy(v1, path),
                Presence::NonZero => at(v1, path).and_then(Value::as_i64).is_some_and(|n| n != 0),
            };
            if hit {
                f.error(
                    path,
                    rule,
                    format!("already set in the v1alpha1 document, which conflicts with the {id} document: remove one of them"),
                );
            }
        }
    }
}

/// The conflict validators that look at more than one v1alpha1 field: `ResolverConfig`,
/// `TimeSyncConfig`, `KubeSpanConfig` and the system `VolumeConfig`s
/// (`V1Alpha1ConflictValidate` in their Talos files).
fn check_conflicts(id: &DocumentId, d: &Value, v1: &Value, f: &mut Findings<'_>) {
    match id.kind.as_str() {
        "ResolverConfig" => {
            let r = "pkg/machinery/config/types/network/resolver.go";
            // Talos counts only nameservers that parse as IP addresses.
            let nameservers = items(v1, "machine.network.nameservers")
                .iter()
                .filter_map(Value::as_str)
                .any(|s| s.parse::<IpAddr>().is_ok());
            if at(v1, "machine.network.searchDomains").is_some() {
                f.error("machine.network.searchDomains", r, ".machine.network.searchDomains is already set in v1alpha1 config; the ResolverConfig document replaces it");
            } else if nameservers {
                f.error("machine.network.nameservers", r, ".machine.network.nameservers is already set in v1alpha1 config; the ResolverConfig document replaces it");
            } else if truthy(v1, "machine.network.disableSearchDomain") {
                f.error("machine.network.disableSearchDomain", r, ".machine.network.disableSearchDomain is already set in v1alpha1 config; the ResolverConfig document replaces it");
            } else if set(d, "hostDNS") && at(v1, "machine.features.hostDNS").is_some() {
                // Only 1.14's ResolverConfig has hostDNS; earlier schemas refuse the field.
                f.error("machine.features.hostDNS", r, ".machine.features.hostDNS is already set in v1alpha1 config; the ResolverConfig document's hostDNS replaces it");
            }
        }
        "TimeSyncConfig" => {
            let r = "pkg/machinery/config/types/network/time_sync.go";
            if at(v1, "machine.time").is_none() {
                return;
            }
            if truthy(v1, "machine.time.disabled") {
                f.error(
                    "machine.time.disabled",
                    r,
                    "time sync cannot be disabled in both v1alpha1 and new-style configuration",
                );
            } else if !items(v1, "machine.time.servers").is_empty() {
                f.error(
                    "machine.time.servers",
                    r,
                    "time servers cannot be specified in both v1alpha1 and new-style configuration",
                );
            } else if at(v1, "machine.time.bootTimeout")
                .and_then(kinds::go_duration)
                .is_some_and(|n| n != 0)
            {
                f.error(
                    "machine.time.bootTimeout",
                    r,
                    "boot timeout cannot be specified in both v1alpha1 and new-style configuration",
                );
            }
        }
        "KubeSpanConfig" if at(v1, "machine.network.kubespan").is_some() => {
            f.error(
                "machine.network.kubespan",
                "pkg/machinery/config/types/network/kubespan.go",
                "kubespan is already configured in v1alpha1 machine.network.kubespan; the KubeSpanConfig document replaces it",
            );
        }
        "VolumeConfig" => {
            let name = text(d, "name");
            let encrypted = !(matches!(text(d, "encryption.provider"), "" | "none")
                && items(d, "encryption.keys").is_empty());
            if matches!(name, "STATE" | "EPHEMERAL") && encrypted {
                let label = name.to_ascii_lowercase();
                if at(v1, &format!("machine.systemDiskEncryption.{label}")).is_some() {
                    f.error(
                        &format!("machine.systemDiskEncryption.{label}"),
                        "pkg/machinery/config/types/block/volume_config.go",
                        format!("system disk encryption for {name:?} is configured in both v1alpha1.Config and VolumeConfig"),
                    );
                }
            }
        }
        _ => {}
    }
}

/// `HostnameConfig.Validate()` (`pkg/machinery/config/types/network/hostname.go`, 1.12+).
fn check_hostname_config(d: &Value, f: &mut Findings<'_>) {
    let rule = "pkg/machinery/config/types/network/hostname.go";
    // `auto` is a `nethelpers.AutoHostnameKind`, read in any capitalisation (`correct.rs`).
    let auto = at(d, "auto")
        .and_then(Value::as_str)
        .map(|a| super::correct::canonical(a, &["off", "talos-addr", "stable"]));
    let hostname = text(d, "hostname");
    if auto.is_none() && hostname.is_empty() {
        f.error(
            "(document root)",
            rule,
            "either 'auto' or 'hostname' must be set",
        );
    }
    if auto.is_some_and(|a| a != "off") && !hostname.is_empty() {
        f.error(
            "auto",
            rule,
            "'auto' and 'hostname' cannot be set at the same time",
        );
    }
    match auto {
        None | Some("off" | "stable") => {}
        Some(other) => f.error(
            "auto",
            rule,
            format!("invalid value for 'auto': {other:?} (Talos takes off or stable)"),
        ),
    }
    if !hostname.is_empty() {
        if hostname.len() > 253 {
            f.error(
                "hostname",
                rule,
                format!("fqdn is too long: {}", hostname.len()),
            );
        }
        let first = hostname.split('.').next().unwrap_or("");
        if first.is_empty() || first.len() > 63 {
            f.error("hostname", rule, format!("invalid hostname {first:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        for ok in ["cluster.local", "a", "a_b.c-d", "x."] {
            assert!(dns_name(ok), "{ok}");
        }
        for bad in ["", "-a", "a..b", "a b", &"x".repeat(64)] {
            assert!(!dns_name(bad), "{bad}");
        }
    }

    #[test]
    fn subnets() {
        for ok in ["10.0.0.0/8", "fd00::/64", "1.2.3.4"] {
            assert!(subnet_or_address(ok), "{ok}");
        }
        for bad in ["10.0.0.0/33", "x", "1.2.3/8"] {
            assert!(!subnet_or_address(bad), "{bad}");
        }
    }
}

//! `Validate()` of Talos 1.14's Kubernetes and cluster documents
//! (`pkg/machinery/config/types/{k8s,cluster}/*.go`, `cri/customization.go`). Image tag checks
//! against the running Talos are left out, as `talosctl validate` leaves them out (it validates
//! with `WithLocal`).

use std::net::IpAddr;

use serde_yaml_ng::Value;

use super::{ip_prefix, Ctx, Doc, KindRule, NOW};
use crate::talos::validate::rules::subnet_or_address;
use crate::talos::validate::x509;

pub(super) const KINDS: &[KindRule] = &[
    (
        "KubeAPIServerConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/apiserver.go",
        apiserver,
    ),
    (
        "KubeAPIServerCAConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/apiserver_ca.go",
        apiserver_ca,
    ),
    (
        "KubeAggregatorCAConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/aggregator_ca.go",
        aggregator_ca,
    ),
    (
        "KubeServiceAccountConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/service_account.go",
        service_account,
    ),
    (
        "KubeControllerManagerConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/controller_manager.go",
        controller_manager,
    ),
    (
        "KubeSchedulerConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/scheduler.go",
        scheduler,
    ),
    (
        "KubeProxyConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/proxy.go",
        proxy,
    ),
    (
        "KubeAuthorizerConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/authorization.go",
        authorizer,
    ),
    (
        "KubeAdmissionControlConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/admission_control.go",
        admission,
    ),
    (
        "KubeClusterConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/cluster.go",
        cluster,
    ),
    (
        "KubeNetworkConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/network.go",
        network,
    ),
    (
        "KubeletConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/kubelet.go",
        kubelet,
    ),
    (
        "KubeNodeConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/node.go",
        node,
    ),
    (
        "KubePrismConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/kubeprism.go",
        kubeprism,
    ),
    (
        "KubeTalosAPIAccessConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/talos_api_access.go",
        talos_api_access,
    ),
    (
        "KubeEtcdEncryptionConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/etcd_encryption.go",
        etcd_encryption,
    ),
    (
        "KubeInlineManifestConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/inline_manifest.go",
        inline_manifest,
    ),
    (
        "KubeExternalManifestConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/external_manifest.go",
        external_manifest,
    ),
    (
        "KubeStaticPodConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/static_pod.go",
        static_pod,
    ),
    (
        "KubeFlannelCNIConfig",
        14,
        NOW,
        "pkg/machinery/config/types/k8s/flannel.go",
        flannel,
    ),
    (
        "DiscoveryIdentityConfig",
        14,
        NOW,
        "pkg/machinery/config/types/cluster/discovery_identity.go",
        discovery_identity,
    ),
    (
        "DiscoveryServiceConfig",
        14,
        NOW,
        "pkg/machinery/config/types/cluster/discovery_service.go",
        discovery_service,
    ),
    (
        "CRICustomizationConfig",
        14,
        NOW,
        "pkg/machinery/config/types/cri/customization.go",
        cri_customization,
    ),
];

/// Pod resources may only name `cpu` and `memory` (`k8s/common.go`).
fn resources(d: &mut Doc<'_, '_>, base: &str) {
    for kind in ["requests", "limits"] {
        let path = format!("{base}.{kind}");
        if let Some(m) = d.at(&path).and_then(Value::as_mapping) {
            let bad: Vec<String> = m
                .keys()
                .filter_map(Value::as_str)
                .filter(|k| !matches!(*k, "memory" | "cpu"))
                .map(str::to_string)
                .collect();
            if let Some(k) = bad.first() {
                return d.err(
                    &format!("{path}.{k}"),
                    format!("unsupported pod resource {k:?}"),
                );
            }
        }
    }
}

/// A pod that can be switched off: checks apply only while `enabled` is not `false`.
fn pod(d: &mut Doc<'_, '_>, what: &str) -> bool {
    if d.at("enabled").and_then(Value::as_bool) == Some(false) {
        return false;
    }
    if d.text("image").is_empty() {
        d.err("image", format!("{what} image cannot be empty"));
    }
    resources(d, "resources");
    true
}

fn apiserver(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.text("image").is_empty() {
        d.err("image", "kube-apiserver image cannot be empty");
    }
    const DENIED: &[(&str, &str)] = &[
        ("anonymous-auth", "use KubeAuthenticationConfig"),
        ("authentication-config", "use KubeAuthenticationConfig"),
        ("authorization-config", "use KubeAuthorizationConfig"),
        ("authorization-mode", "use KubeAuthorizationConfig"),
        ("authorization-webhook-", "use KubeAuthorizationConfig"),
        ("oidc-", "use KubeAuthenticationConfig"),
    ];
    let args: Vec<String> = d
        .at("extraArgs")
        .and_then(Value::as_mapping)
        .map(|m| {
            m.keys()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for (prefix, instead) in DENIED {
        for a in args.iter().filter(|a| a.starts_with(prefix)) {
            d.err(
                &format!("extraArgs.{a}"),
                format!("kube-apiserver extra argument {a:?} is not allowed: {instead}"),
            );
        }
    }
    resources(d, "resources");
}

/// A certificate and key pair as `meta.CertificateAndKey.Validate(true)` checks it
/// (`pkg/machinery/config/types/meta/certificate_key.go`): both set, PEM blocks of the right
/// types, then the certificate and the key parsed (siderolabs/crypto `GetCert`, `GetKey`).
fn cert_and_key(d: &mut Doc<'_, '_>, base: &str, what: &str) {
    let crt = d.text(&format!("{base}.cert"));
    let key = d.text(&format!("{base}.key"));
    let cert_at = format!("{base}.cert");
    let key_at = format!("{base}.key");
    let problem = if crt.is_empty() {
        Some((&cert_at, "certificate is required".to_string()))
    } else if key.is_empty() {
        Some((&key_at, "key is required".to_string()))
    } else if let Err(e) = x509::assert_valid_pem(crt, &["CERTIFICATE"]) {
        Some((&cert_at, format!("certificate: {e}")))
    } else if let Err(e) = x509::assert_valid_pem(key, &[]) {
        Some((&key_at, format!("key: {e}")))
    } else if let Err(e) = x509::get_cert(crt) {
        Some((&cert_at, format!("certificate is invalid: {e}")))
    } else if let Err(e) = x509::get_key(key, x509::KeyReader::CertificateAndKey) {
        Some((&key_at, format!("key is invalid: {e}")))
    } else {
        None
    };
    if let Some((path, message)) = problem {
        d.err(path, format!("{what}: {message}"));
    }
}

fn accepted_cas(d: &mut Doc<'_, '_>) {
    for (i, ca) in d.items("acceptedCAs").iter().enumerate() {
        if let Err(e) = x509::assert_valid_pem(ca.as_str().unwrap_or(""), &["CERTIFICATE"]) {
            d.err(
                &format!("acceptedCAs[{i}]"),
                format!("accepted CA #{i}: {e}"),
            );
        }
    }
}

fn apiserver_ca(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.at("issuingCA").is_some() {
        cert_and_key(d, "issuingCA", "issuing CA");
    }
    accepted_cas(d);
}

fn aggregator_ca(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.at("issuingCA").is_none() {
        d.err("issuingCA", "issuing CA is not set");
    } else {
        cert_and_key(d, "issuingCA", "issuing CA");
    }
    accepted_cas(d);
}

fn service_account(d: &mut Doc<'_, '_>, _: &Ctx) {
    let key = d.text("issuer.privateKey");
    if key.is_empty() {
        d.err(
            "issuer.privateKey",
            "service issuer private key is required",
        );
    } else if let Err(e) = x509::get_key(key, x509::KeyReader::Key) {
        d.err(
            "issuer.privateKey",
            format!("service issuer private key is invalid: {e}"),
        );
    }
    if d.text("issuer.issuerURL").is_empty() {
        d.err("issuer.issuerURL", "service issuer URL is required");
    }
}

fn controller_manager(d: &mut Doc<'_, '_>, _: &Ctx) {
    pod(d, "kube-controller-manager");
}

fn scheduler(d: &mut Doc<'_, '_>, _: &Ctx) {
    pod(d, "scheduler");
}

fn proxy(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.at("enabled").and_then(Value::as_bool) == Some(false) {
        return;
    }
    if d.text("image").is_empty() {
        d.err("image", "proxy image cannot be empty");
    }
    match d.text("mode") {
        "" | "nftables" => {}
        m @ ("iptables" | "ipvs") => d.warn(
            "mode",
            format!("proxy mode {m:?} is not recommended, please switch to nftables if possible"),
        ),
        m => d.err(
            "mode",
            format!("invalid proxy mode {m:?}: supported modes are iptables, ipvs and nftables"),
        ),
    }
    if d.set("extraArgs") {
        d.warn(
            "extraArgs",
            "extra arguments for kube-proxy may not work as expected, please use configuration instead",
        );
    }
    resources(d, "resources");
}

fn authorizer(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("authorizer name is required");
    let t = d.text("type");
    if t.is_empty() {
        d.err("type", "authorizer type is required");
    }
    if !matches!(t, "Node" | "RBAC" | "Webhook") {
        d.err(
            "type",
            format!("authorizer type {t} is not allowed, allowed types are [Node RBAC Webhook]"),
        );
    }
    let webhook = d.set("webhook");
    if t == "Webhook" && !webhook {
        d.err(
            "webhook",
            "authorizer webhook configuration is required for Webhook authorizer type",
        );
    }
    if t != "Webhook" && webhook {
        d.warn(
            "webhook",
            "authorizer webhook configuration is not allowed for non-Webhook authorizer types",
        );
    }
}

fn admission(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("admission control plugin name is required");
}

fn cluster(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.text("clusterName").is_empty() {
        d.err("clusterName", "clusterName must be specified");
    }
    let ep = d.text("endpoint");
    if ep.is_empty() {
        d.err("endpoint", "endpoint must be specified");
    } else if !crate::talos::validate::rules::endpoint_uri(ep) {
        d.err("endpoint", format!("cluster endpoint is invalid: {ep:?}"));
    }
}

/// One pod or service subnet: valid, masked, at least 4 host bits.
fn subnet(s: &str) -> Result<(IpAddr, u8), String> {
    let (ip, bits) = ip_prefix(s).ok_or_else(|| format!("invalid subnet: {s}"))?;
    if !super::masked(ip, bits) {
        return Err(format!("invalid subnet: {s} is not a valid CIDR"));
    }
    let len = if ip.is_ipv4() { 32 } else { 128 };
    if len - u32::from(bits) < 4 {
        return Err(format!(
            "invalid subnet: /{bits} is too small, it must be larger than /{}",
            i64::from(bits) - 4
        ));
    }
    Ok((ip, bits))
}

fn subnets(
    d: &mut Doc<'_, '_>,
    key: &str,
    what: &str,
    size: &dyn Fn(IpAddr, u8) -> Result<(), String>,
) {
    let list = d.items(key);
    let problem = (|| {
        if list.is_empty() {
            return Err("at least one subnet must be specified".to_string());
        }
        if list.len() > 2 {
            return Err("at most two subnets can be specified for dual-stack clusters".into());
        }
        let (mut v4, mut v6) = (0, 0);
        for s in list {
            let (ip, bits) = subnet(s.as_str().unwrap_or(""))?;
            size(ip, bits)?;
            if ip.is_ipv4() {
                v4 += 1;
            } else {
                v6 += 1;
            }
        }
        if v4 > 1 || v6 > 1 {
            return Err(
                "at most one IPv4 and one IPv6 subnet can be specified for dual-stack clusters"
                    .into(),
            );
        }
        Ok(())
    })();
    if let Err(e) = problem {
        d.err(key, format!("{what}: {e}"));
    }
}

fn network(d: &mut Doc<'_, '_>, _: &Ctx) {
    let mask = |k: &str| d.at(k).and_then(Value::as_i64).unwrap_or(0);
    let (m4, m6) = (mask("nodeCIDRMaskSizeIPv4"), mask("nodeCIDRMaskSizeIPv6"));
    let ok4 = m4 == 0 || (1..=32).contains(&m4);
    let ok6 = m6 == 0 || (1..=128).contains(&m6);
    if !ok4 {
        d.err(
            "nodeCIDRMaskSizeIPv4",
            "nodeCIDRMaskSizeIPv4 must be between 1 and 32",
        );
    }
    if !ok6 {
        d.err(
            "nodeCIDRMaskSizeIPv6",
            "nodeCIDRMaskSizeIPv6 must be between 1 and 128",
        );
    }
    let node4 = if m4 == 0 { 24 } else { m4 };
    let node6 = if m6 == 0 { 64 } else { m6 };
    let pod_size = move |ip: IpAddr, bits: u8| {
        let (node, valid) = if ip.is_ipv4() {
            (node4, ok4)
        } else {
            (node6, ok6)
        };
        if !valid {
            return Ok(());
        }
        let bits = i64::from(bits);
        if bits > node {
            return Err(format!(
                "invalid subnet: /{bits} is smaller than the per-node pod CIDR mask size /{node}"
            ));
        }
        if node - bits > 16 {
            return Err(format!(
                "invalid subnet: /{bits} is too large for the per-node pod CIDR mask size /{node}, the difference must be at most 16 bits"
            ));
        }
        Ok(())
    };
    let service_size = |ip: IpAddr, bits: u8| {
        let len: u32 = if ip.is_ipv4() { 32 } else { 128 };
        if len - u32::from(bits) > 20 {
            return Err(format!(
                "invalid subnet: /{bits} is too large, it must be at least /{} (at most 20 host identifier bits)",
                len - 20
            ));
        }
        Ok(())
    };
    subnets(d, "podSubnets", "pod subnets", &pod_size);
    subnets(d, "serviceSubnets", "service subnets", &service_size);
    if d.items("podSubnets").len() != d.items("serviceSubnets").len() {
        d.err(
            "serviceSubnets",
            "the number of pod subnets must match the number of service subnets",
        );
    }
}

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

fn kubelet(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.text("image").is_empty() {
        d.err("image", "kubelet image cannot be empty");
    }
    if let Some(cfg) = d.at("config").and_then(Value::as_mapping) {
        let hits: Vec<&str> = KUBELET_PROTECTED
            .iter()
            .copied()
            .filter(|f| cfg.contains_key(*f))
            .collect();
        for f in hits {
            d.err(
                &format!("config.{f}"),
                format!("kubelet configuration field {f:?} can't be overridden"),
            );
        }
    }
}

fn node(d: &mut Doc<'_, '_>, _: &Ctx) {
    for (i, c) in d.items("nodeIP.validSubnets").iter().enumerate() {
        let c = c.as_str().unwrap_or("");
        if !subnet_or_address(c.trim_start_matches('!')) {
            d.err(
                &format!("nodeIP.validSubnets[{i}]"),
                format!("nodeIP subnet is not valid: {c:?}"),
            );
        }
    }
    crate::talos::validate::v1alpha1::check_labels(
        d.v,
        ["labels", "annotations", "taints"],
        &mut d.f,
        d.rule,
    );
}

fn kubeprism(d: &mut Doc<'_, '_>, _: &Ctx) {
    let port = d.at("port").and_then(Value::as_i64).unwrap_or(0);
    if !(1..=65535).contains(&port) {
        d.err(
            "port",
            format!("invalid port {port}: must be in range 1-65535"),
        );
    }
}

fn talos_api_access(d: &mut Doc<'_, '_>, _: &Ctx) {
    const ROLES: &[&str] = &[
        "os:admin",
        "os:operator",
        "os:reader",
        "os:etcd:backup",
        "os:image:verifier",
        "os:meta:writer",
        "os:impersonator",
    ];
    for (i, r) in d.items("allowedRoles").iter().enumerate() {
        let r = r.as_str().unwrap_or("");
        if !ROLES.contains(&r) {
            d.err(
                &format!("allowedRoles[{i}]"),
                format!("invalid role {r:?} in .allowedRoles"),
            );
        }
    }
}

fn etcd_encryption(d: &mut Doc<'_, '_>, _: &Ctx) {
    if !d.set("config") {
        d.err("config", "etcd encryption config is required");
    }
}

fn dns1123(name: &str) -> bool {
    name.len() <= 253
        && !name.is_empty()
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn manifest_name(d: &mut Doc<'_, '_>, what: &str) {
    let name = d.name();
    if name.is_empty() {
        d.err("name", format!("{what} name is required"));
    } else if !dns1123(name) {
        d.err(
            "name",
            format!("{what} name is invalid: domain doesn't match required format: {name:?}"),
        );
    }
}

fn inline_manifest(d: &mut Doc<'_, '_>, _: &Ctx) {
    manifest_name(d, "manifest");
}

fn external_manifest(d: &mut Doc<'_, '_>, _: &Ctx) {
    manifest_name(d, "manifest");
    let u = d.text("url");
    if u.is_empty() {
        d.err("url", "manifest URL is required");
    } else {
        let scheme = u.split_once("://").map_or("", |(s, _)| s);
        if !matches!(scheme, "http" | "https") {
            d.err(
                "url",
                format!("manifest URL scheme must be http or https: {scheme:?}"),
            );
        }
    }
}

fn static_pod(d: &mut Doc<'_, '_>, _: &Ctx) {
    manifest_name(d, "static pod");
    if !d.set("pod") {
        d.err("pod", "static pod spec is required");
    }
}

fn flannel(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.text("backendType").is_empty() {
        d.err("backendType", "flannel backend type must be specified");
    }
    resources(d, "resources");
}

fn discovery_identity(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.text("clusterID").is_empty() {
        return d.err("clusterID", "clusterID is required");
    }
    let secret = d.text("clusterSecret");
    if secret.is_empty() {
        return d.err("clusterSecret", "clusterSecret is required");
    }
    use base64::Engine;
    let ok = base64::engine::general_purpose::STANDARD
        .decode(secret)
        .is_ok_and(|b| b.len() == 32);
    if !ok {
        d.err(
            "clusterSecret",
            "invalid clusterSecret: must be standard base64 of 32 bytes",
        );
    }
}

fn discovery_service(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.name().is_empty() {
        return d.err("name", "name is required");
    }
    let ep = d.text("endpoint");
    if ep.is_empty() {
        return d.err("endpoint", "endpoint is required");
    }
    let Some((scheme, rest)) = ep.split_once("://") else {
        return d.err("endpoint", "endpoint scheme is required");
    };
    if !matches!(scheme, "http" | "https" | "grpc") {
        return d.err(
            "endpoint",
            "endpoint scheme must be http://, https:// or grpc://",
        );
    }
    let host = rest.split(['/', '?', '#', ':']).next().unwrap_or("");
    if host.is_empty() {
        d.err("endpoint", "endpoint host is required");
    }
}

fn cri_customization(d: &mut Doc<'_, '_>, _: &Ctx) {
    let name = d.name();
    if let Err(e) = crate::talos::validate::v1alpha1::qualified_name(name) {
        d.err("name", format!("invalid name: {e}"));
    }
    if name == "customization" {
        d.err(
            "name",
            "name \"customization\" is reserved for the legacy CRI customization",
        );
    }
}

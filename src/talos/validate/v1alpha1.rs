//! More of Talos' v1alpha1 validator (`pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go`
//! and the `Validate()` of its sub-structs: `v1alpha1_apiserverconfig.go`,
//! `v1alpha1_resourcesconfig.go`, `v1alpha1_logging.go`, `v1alpha1_authorizaationconfigauthorizer.go`,
//! and `pkg/machinery/labels/validate.go`): bonds, WireGuard, VLANs, addresses and routes of
//! `machine.network.interfaces`, KubeSpan, logging destinations, node labels, annotations and
//! taints, control-plane component resources and authorizers, registries, the node address sort
//! algorithm. Gated by release as Talos has them. Pure functions over YAML.

use base64::Engine;
use serde_yaml_ng::Value;

use super::kinds::ip_prefix;
use super::oci::{decode_spec, SpecVersion};
use super::rules::{at, items, set, subnet_or_address, text, truthy, Findings};
use super::V1ALPHA1_RULES as R;
use crate::talos::TalosVersion;

const LABELS: &str = "pkg/machinery/labels/validate.go";

/// The extra v1alpha1 rules.
pub(super) fn check(
    doc: &Value,
    control_plane: Option<bool>,
    version: TalosVersion,
    f: &mut Findings<'_>,
) {
    let m = version.minor;

    // The decoder base64-decodes the certificate and key fields.
    super::x509::check_v1alpha1_base64(
        doc,
        f,
        "pkg/machinery/config/types/v1alpha1/v1alpha1_types.go",
    );

    // Control planes need an issuing CA, not only accepted CAs.
    if control_plane == Some(true)
        && at(doc, "machine.ca").is_none()
        && set(doc, "machine.acceptedCAs")
    {
        f.error("machine.ca", R, "issuing CA is required (.machine.ca)");
    }

    // Until 1.14 the cluster section must name the control plane endpoint.
    if m < 14 && at(doc, "cluster").is_some() && at(doc, "cluster.controlPlane").is_none() {
        f.error(
            "cluster.controlPlane.endpoint",
            R,
            "cluster controlplane endpoint is required",
        );
    }

    if control_plane == Some(true) {
        if let Some(etcd) = at(doc, "cluster.etcd") {
            if at(etcd, "ca").is_none() {
                f.error(
                    "cluster.etcd.ca",
                    R,
                    "key/cert combination should not be empty (the etcd CA)",
                );
            }
        }
    }

    // Control-plane components.
    if let Some(api) = at(doc, "cluster.apiServer") {
        let authorizers = items(api, "authorizationConfig");
        if !authorizers.is_empty() {
            if let Some(args) = at(api, "extraArgs").and_then(Value::as_mapping) {
                for k in args.keys().filter_map(Value::as_str) {
                    if k == "authorization-mode" {
                        f.error(
                            "cluster.apiServer.extraArgs.authorization-mode",
                            R,
                            "authorization-mode cannot be used in conjunction with AuthorizationConfig, use either AuthorizationConfig or authorization-mode",
                        );
                    } else if k.starts_with("authorization-webhook-") {
                        f.error(
                            &format!("cluster.apiServer.extraArgs.{k}"),
                            R,
                            "authorization-webhook-* flags cannot be used in conjunction with AuthorizationConfig",
                        );
                    }
                }
            }
        }
        for (i, a) in authorizers.iter().enumerate() {
            let p = format!("cluster.apiServer.authorizationConfig[{i}]");
            let t = text(a, "type");
            if t.is_empty() {
                f.error(&format!("{p}.type"), R, "authorizer type must be set");
            } else if text(a, "name").is_empty() {
                f.error(&format!("{p}.name"), R, "authorizer name must be set");
            } else if !matches!(t, "Node" | "RBAC" | "Webhook") {
                f.error(
                    &format!("{p}.type"),
                    R,
                    format!(
                        "authorizer type {t} is not allowed, allowed types are [Node RBAC Webhook]"
                    ),
                );
            }
        }
    }
    for (section, name) in [
        ("apiServer", "apiserver"),
        ("controllerManager", "controller-manager"),
        ("scheduler", "scheduler"),
    ] {
        for kind in ["requests", "limits"] {
            let path = format!("cluster.{section}.resources.{kind}");
            if let Some(res) = at(doc, &path).and_then(Value::as_mapping) {
                if let Some(k) = res
                    .keys()
                    .filter_map(Value::as_str)
                    .find(|k| !matches!(*k, "memory" | "cpu"))
                {
                    f.error(
                        &format!("{path}.{k}"),
                        R,
                        format!(
                            "{name} resource validation failed: unsupported pod resource {k:?}"
                        ),
                    );
                }
            }
        }
    }

    check_devices(doc, f);

    // KubeSpan (in the v1alpha1 document).
    if truthy(doc, "machine.network.kubespan.enabled") {
        if m < 14 {
            if !truthy(doc, "cluster.discovery.enabled") {
                f.error(
                    "cluster.discovery.enabled",
                    R,
                    ".cluster.discovery should be enabled when .machine.network.kubespan is enabled",
                );
            }
            if !set(doc, "cluster.id") {
                f.error(
                    "cluster.id",
                    R,
                    ".cluster.id should be set when .machine.network.kubespan is enabled",
                );
            }
            if !set(doc, "cluster.secret") {
                f.error(
                    "cluster.secret",
                    R,
                    ".cluster.secret should be set when .machine.network.kubespan is enabled",
                );
            }
        }
        for (i, c) in items(doc, "machine.network.kubespan.filters.endpoints")
            .iter()
            .enumerate()
        {
            let c = c.as_str().unwrap_or("");
            if !subnet_or_address(c.trim_start_matches('!')) {
                f.error(
                    &format!("machine.network.kubespan.filters.endpoints[{i}]"),
                    R,
                    format!("KubeSpan endpoint filter is not valid: {c:?}"),
                );
            }
        }
    }
    if m >= 12 {
        for (i, c) in items(
            doc,
            "machine.network.kubespan.filters.excludeAdvertisedNetworks",
        )
        .iter()
        .enumerate()
        {
            let c = c.as_str().unwrap_or("");
            if ip_prefix(c).is_none() {
                f.error(
                    &format!("machine.network.kubespan.filters.excludeAdvertisedNetworks[{i}]"),
                    R,
                    format!("KubeSpan exclude advertised networks filter is not valid: {c:?}"),
                );
            }
        }
    }

    // Logging destinations.
    for (i, dest) in items(doc, "machine.logging.destinations")
        .iter()
        .enumerate()
    {
        let p = format!("machine.logging.destinations[{i}]");
        let ep = text(dest, "endpoint");
        if ep.is_empty() {
            f.error(&format!("{p}.endpoint"), R, "empty logging endpoint");
        } else {
            let (scheme, rest) = ep.split_once("://").unwrap_or(("", ep));
            let host = rest.split(['/', '?', '#']).next().unwrap_or("");
            if host.is_empty() {
                f.error(&format!("{p}.endpoint"), R, "empty logging endpoint's host");
            }
            if !matches!(scheme, "tcp" | "udp") {
                f.error(
                    &format!("{p}.endpoint"),
                    R,
                    format!("unexpected logging endpoint scheme {scheme:?}"),
                );
            }
        }
        let format = text(dest, "format");
        if format != "json_lines" {
            f.error(
                &format!("{p}.format"),
                R,
                format!("unknown logging format {format:?}"),
            );
        }
    }

    check_labels(
        doc,
        [
            "machine.nodeLabels",
            "machine.nodeAnnotations",
            "machine.nodeTaints",
        ],
        f,
        LABELS,
    );

    // Kubernetes access to the Talos API needs RBAC in 1.11 (RBAC is off unless set there).
    if m < 12
        && truthy(doc, "machine.features.kubernetesTalosAPIAccess.enabled")
        && !truthy(doc, "machine.features.rbac")
    {
        f.error(
            "machine.features.rbac",
            R,
            "feature API RBAC should be enabled when Kubernetes Talos API Access feature is enabled",
        );
    }

    let sort = text(doc, "machine.features.nodeAddressSortAlgorithm");
    // Talos parses it with `nethelpers.AddressSortAlgorithmString` (enumer), which takes any
    // capitalisation (`V1`); the bond fields below go through exact `...ByName` switches.
    if !sort.is_empty() && super::correct::fold_enum(sort, &["v1", "v2"]).is_none() {
        f.error(
            "machine.features.nodeAddressSortAlgorithm",
            R,
            format!("invalid node address sort algorithm: {sort:?} is not v1 or v2"),
        );
    }

    // A registry key with no value decodes to nil, which Talos refuses.
    for section in ["config", "mirrors"] {
        if let Some(map) =
            at(doc, &format!("machine.registries.{section}")).and_then(Value::as_mapping)
        {
            for (k, v) in map {
                if v.is_null() {
                    let k = crate::talos::scalar_text(k).unwrap_or_default();
                    f.error(
                        &format!("machine.registries.{section}.{k}"),
                        R,
                        format!("registries.{section}[{k:?}] is null"),
                    );
                }
            }
        }
    }

    if let Some(o) = at(doc, "machine.baseRuntimeSpecOverrides") {
        if !o.is_mapping() {
            f.error(
                "machine.baseRuntimeSpecOverrides",
                R,
                "failed to unmarshal base runtime spec overrides: not an OCI runtime spec object",
            );
        } else if let Err(e) = decode_spec(o, SpecVersion::of(version)) {
            let what = if e.marshal { "marshal" } else { "unmarshal" };
            f.error(
                &format!("machine.baseRuntimeSpecOverrides.{}", e.path),
                R,
                format!(
                    "failed to {what} base runtime spec overrides: {}",
                    e.message
                ),
            );
        }
    }
}

/// Kubernetes' rules for node labels, annotations and taints (`pkg/machinery/labels/validate.go`)
/// at `paths` (labels, annotations, taints).
pub(super) fn check_labels(
    doc: &Value,
    paths: [&str; 3],
    f: &mut Findings<'_>,
    rule: &'static str,
) {
    if let Some(labels) = at(doc, paths[0]).and_then(Value::as_mapping) {
        for (k, v) in labels {
            let k = crate::talos::scalar_text(k).unwrap_or_default();
            let v = crate::talos::scalar_text(v).unwrap_or_default();
            let p = format!("{}.{k}", paths[0]);
            if let Err(e) = qualified_name(&k) {
                f.error(&p, rule, format!("invalid node labels: {e}"));
            }
            if let Err(e) = label_value(&v) {
                f.error(&p, rule, format!("invalid node labels: {e}"));
            }
        }
    }
    if let Some(ann) = at(doc, paths[1]).and_then(Value::as_mapping) {
        let mut size = 0usize;
        for (k, v) in ann {
            let k = crate::talos::scalar_text(k).unwrap_or_default();
            let v = crate::talos::scalar_text(v).unwrap_or_default();
            let p = format!("{}.{k}", paths[1]);
            if let Err(e) = qualified_name(&k) {
                f.error(&p, rule, format!("invalid node annotations: {e}"));
            }
            if matches!(
                k.as_str(),
                "talos.dev/owned-labels" | "talos.dev/owned-annotations" | "talos.dev/owned-taints"
            ) {
                f.error(
                    &p,
                    rule,
                    format!("invalid node annotations: annotation {k:?} is reserved"),
                );
            }
            size += k.len() + v.len();
        }
        if size > 256 * 1024 {
            f.error(
                paths[1],
                rule,
                "invalid node annotations: total annotation size exceeds limit of 262144 bytes",
            );
        }
    }
    if let Some(taints) = at(doc, paths[2]).and_then(Value::as_mapping) {
        for (k, v) in taints {
            let k = crate::talos::scalar_text(k).unwrap_or_default();
            let v = crate::talos::scalar_text(v).unwrap_or_default();
            let p = format!("{}.{k}", paths[2]);
            if let Err(e) = qualified_name(&k) {
                f.error(&p, rule, format!("invalid node taints: {e}"));
                continue;
            }
            let (value, effect) = match v.split_once(':') {
                Some((a, b)) => (Some(a), b),
                None => (None, v.as_str()),
            };
            if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                f.error(
                    &p,
                    rule,
                    format!("invalid node taints: invalid taint effect: {effect:?}"),
                );
                continue;
            }
            if let Some(value) = value {
                if let Err(e) = label_value(value) {
                    f.error(&p, rule, format!("invalid node taints: {e}"));
                }
            }
        }
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`, at most 253.
fn dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && !s.is_empty()
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A Kubernetes qualified name: `[prefix/]name`.
pub(super) fn qualified_name(v: &str) -> Result<(), String> {
    let parts: Vec<&str> = v.split('/').collect();
    let name = match parts.as_slice() {
        [n] => *n,
        [prefix, n] => {
            if prefix.is_empty() {
                return Err(format!("prefix cannot be empty: {v:?}"));
            }
            if !dns1123_subdomain(prefix) {
                return Err(format!("prefix {prefix:?} is invalid"));
            }
            *n
        }
        _ => return Err(format!("invalid format: too many slashes: {v:?}")),
    };
    if name.is_empty() {
        Err(format!("name cannot be empty: {v:?}"))
    } else if name.len() > 63 {
        Err(format!("name is too long: {v:?} (limit is 63)"))
    } else if !qualified_part(name) {
        Err(format!("name {name:?} is invalid"))
    } else {
        Ok(())
    }
}

fn label_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        Err(format!("label value length exceeds limit of 63: {v:?}"))
    } else if !v.is_empty() && !qualified_part(v) {
        Err(format!("label value {v:?} is invalid"))
    } else {
        Ok(())
    }
}

/// `validateIPOrCIDR`: an address, or an address with a prefix length.
fn ip_or_cidr(s: &str) -> bool {
    if s.contains('/') {
        ip_prefix(s).is_some()
    } else {
        s.parse::<std::net::IpAddr>().is_ok()
    }
}

/// The per-device checks of `machine.network.interfaces` that the core rules do not make.
fn check_devices(doc: &Value, f: &mut Findings<'_>) {
    for (i, d) in items(doc, "machine.network.interfaces").iter().enumerate() {
        if truthy(d, "ignore") {
            continue;
        }
        let p = format!("machine.network.interfaces[{i}]");
        if let Some(b) = at(d, "bond") {
            check_bond(b, &format!("{p}.bond"), f);
        }
        if let Some(w) = at(d, "wireguard") {
            check_wireguard(w, &format!("{p}.wireguard"), f);
        }
        for (j, v) in items(d, "vlans").iter().enumerate() {
            let vp = format!("{p}.vlans[{j}]");
            let cidr = text(v, "cidr");
            if !items(v, "addresses").is_empty() && !cidr.is_empty() {
                f.error(&vp, R, "vlan can't have both .cidr and .addresses set");
            }
            if !cidr.is_empty() && !ip_or_cidr(cidr) {
                f.error(
                    &format!("{vp}.cidr"),
                    R,
                    format!("{cidr:?} is not an IP address or CIDR"),
                );
            }
            for (k, a) in items(v, "addresses").iter().enumerate() {
                let a = a.as_str().unwrap_or("");
                if !ip_or_cidr(a) {
                    f.error(
                        &format!("{vp}.addresses[{k}]"),
                        R,
                        format!("failed to parse IP address {a:?}"),
                    );
                }
            }
        }
        let cidr = text(d, "cidr");
        if !cidr.is_empty() && !ip_or_cidr(cidr) {
            f.error(
                &format!("{p}.cidr"),
                R,
                format!("{cidr:?} is not an IP address or CIDR"),
            );
        }
        for (k, a) in items(d, "addresses").iter().enumerate() {
            let a = a.as_str().unwrap_or("");
            if !ip_or_cidr(a) {
                f.error(
                    &format!("{p}.addresses[{k}]"),
                    R,
                    format!("failed to parse IP address {a:?}"),
                );
            }
        }
        if at(d, "vip").is_some() {
            let ip = text(d, "vip.ip");
            if ip.parse::<std::net::IpAddr>().is_err() {
                f.error(
                    &format!("{p}.vip.ip"),
                    R,
                    format!("failed to parse {ip:?} as IP address"),
                );
            }
        }
        for (k, r) in items(d, "routes").iter().enumerate() {
            let rp = format!("{p}.routes[{k}]");
            let network = text(r, "network");
            let gateway = text(r, "gateway");
            let source = text(r, "source");
            if !network.is_empty() && ip_prefix(network).is_none() {
                f.error(
                    &format!("{rp}.network"),
                    R,
                    format!("{network:?}: invalid network address"),
                );
            }
            if !gateway.is_empty() && gateway.parse::<std::net::IpAddr>().is_err() {
                f.error(
                    &format!("{rp}.gateway"),
                    R,
                    format!("{gateway:?}: invalid network address"),
                );
            }
            if gateway.is_empty() && network.is_empty() {
                f.error(&rp, R, "either network or gateway should be set");
            }
            if !source.is_empty() && source.parse::<std::net::IpAddr>().is_err() {
                f.error(
                    &format!("{rp}.source"),
                    R,
                    format!("{source:?}: invalid network address"),
                );
            }
        }
    }
}

/// `checkBond` of the v1alpha1 validator.
fn check_bond(b: &Value, p: &str, f: &mut Findings<'_>) {
    let word = |k: &str| text(b, k);
    let num = |k: &str| at(b, k).and_then(Value::as_u64).unwrap_or(0);
    let mode = word("mode");
    let known: &[(&str, &[&str], &str)] = &[
        (
            "mode",
            &[
                "",
                "balance-rr",
                "active-backup",
                "balance-xor",
                "broadcast",
                "802.3ad",
                "balance-tlb",
                "balance-alb",
            ],
            "invalid bond type",
        ),
        (
            "xmitHashPolicy",
            &["", "layer2", "layer3+4", "layer2+3", "encap2+3", "encap3+4"],
            "invalid xmit hash policy",
        ),
        ("lacpRate", &["", "slow", "fast"], "invalid lacp rate"),
        (
            "arpValidate",
            &[
                "",
                "none",
                "active",
                "backup",
                "all",
                "filter",
                "filter-active",
                "filter-backup",
            ],
            "invalid arp validate mode",
        ),
        (
            "arpAllTargets",
            &["", "any", "all"],
            "invalid arp_all_targets mode",
        ),
        (
            "primaryReselect",
            &["", "always", "better", "failure"],
            "invalid primary_reselect mode",
        ),
        (
            "failOverMac",
            &["", "none", "active", "follow"],
            "invalid fail_over_mac value",
        ),
        (
            "adSelect",
            &["", "stable", "bandwidth", "count"],
            "invalid ad_select mode",
        ),
    ];
    for (key, allowed, what) in known {
        let v = word(key);
        if !allowed.contains(&v) {
            f.error(&format!("{p}.{key}"), R, format!("{what} {v}"));
        }
    }
    let mode = if mode.is_empty() { "balance-rr" } else { mode };
    if set(b, "arpIPTarget") {
        f.error(
            &format!("{p}.arpIPTarget"),
            R,
            "bond.arpIPTarget is not supported",
        );
    }
    if !word("lacpRate").is_empty() && mode != "802.3ad" {
        f.error(
            &format!("{p}.lacpRate"),
            R,
            "bond.lacpRate is only available in 802.3ad mode",
        );
    }
    if !word("adActorSystem").is_empty() {
        f.error(
            &format!("{p}.adActorSystem"),
            R,
            "bond.adActorSystem is not supported",
        );
    }
    let lb = matches!(mode, "802.3ad" | "balance-alb" | "balance-tlb");
    if lb && !word("arpValidate").is_empty() {
        f.error(
            &format!("{p}.arpValidate"),
            R,
            format!("bond.arpValidate is not available in {mode} mode"),
        );
    }
    if !matches!(mode, "active-backup" | "balance-alb" | "balance-tlb")
        && !word("primary").is_empty()
    {
        f.error(
            &format!("{p}.primary"),
            R,
            format!("bond.primary is not available in {mode} mode"),
        );
    }
    if lb && num("arpInterval") > 0 {
        f.error(
            &format!("{p}.arpInterval"),
            R,
            format!("bond.arpInterval is not available in {mode} mode"),
        );
    }
    if mode != "balance-rr" && num("packetsPerSlave") > 1 {
        f.error(
            &format!("{p}.packetsPerSlave"),
            R,
            format!("bond.packetsPerSlave is not available in {mode} mode"),
        );
    }
    if !matches!(mode, "balance-alb" | "balance-tlb") && num("tlbDynamicLb") > 0 {
        f.error(
            &format!("{p}.tlbDynamicLb"),
            R,
            format!("bond.tlbDynamicTLB is not available in {mode} mode"),
        );
    }
    if mode != "802.3ad" && num("adActorSysPrio") > 0 {
        f.error(
            &format!("{p}.adActorSysPrio"),
            R,
            "bond.adActorSysPrio is only available in 802.3ad mode",
        );
    }
    if mode != "802.3ad" && num("adUserPortKey") > 0 {
        f.error(
            &format!("{p}.adUserPortKey"),
            R,
            "bond.adUserPortKey is only available in 802.3ad mode",
        );
    }
}

/// A WireGuard key: standard base64 of 32 bytes.
fn wg_key(key: &str) -> Result<(), String> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(key)
        .map_err(|e| e.to_string())?;
    if raw.len() != 32 {
        return Err(format!("wrong key {key:?} length: {}", raw.len()));
    }
    Ok(())
}

/// `checkWireguard` of the v1alpha1 validator.
fn check_wireguard(w: &Value, p: &str, f: &mut Findings<'_>) {
    if let Err(e) = wg_key(text(w, "privateKey")) {
        f.error(
            &format!("{p}.privateKey"),
            R,
            format!("private key is invalid: {e}"),
        );
    }
    for (i, peer) in items(w, "peers").iter().enumerate() {
        let pp = format!("{p}.peers[{i}]");
        if let Err(e) = wg_key(text(peer, "publicKey")) {
            f.error(
                &format!("{pp}.publicKey"),
                R,
                format!("public key invalid: {e}"),
            );
        }
        let ep = text(peer, "endpoint");
        if !ep.is_empty() && !address_has_port(ep) {
            f.error(
                &format!("{pp}.endpoint"),
                R,
                format!("peer endpoint {ep:?} is invalid"),
            );
        }
        for (j, a) in items(peer, "allowedIPs").iter().enumerate() {
            let a = a.as_str().unwrap_or("");
            if ip_prefix(a).is_none() {
                f.error(
                    &format!("{pp}.allowedIPs[{j}]"),
                    R,
                    format!("peer allowed IP {a:?} is invalid"),
                );
            }
        }
    }
}

/// Whether `host:port` carries a port (siderolabs/net `AddressContainsPort`).
fn address_has_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => {
            !port.is_empty()
                && port.bytes().all(|c| c.is_ascii_digit())
                && (!host.contains(':') || (host.starts_with('[') && host.ends_with(']')))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_names() {
        for ok in [
            "a",
            "example.com/role",
            "node-role.kubernetes.io/worker",
            "A_b.c",
        ] {
            assert_eq!(qualified_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "/a", "a/b/c", "-a", "Example.com/a", &"x".repeat(64)] {
            assert!(qualified_name(bad).is_err(), "{bad}");
        }
        assert!(label_value("").is_ok());
        assert!(label_value("a b").is_err());
    }

    #[test]
    fn endpoints_with_ports() {
        assert!(address_has_port("1.2.3.4:51820"));
        assert!(address_has_port("[fd00::1]:51820"));
        assert!(!address_has_port("1.2.3.4"));
        assert!(!address_has_port("fd00::1"));
    }
}

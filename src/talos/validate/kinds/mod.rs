//! The `Validate()` of each multi-document config kind Talos registers
//! (`pkg/machinery/config/types/<group>/*.go`), ported as rules over YAML data, one file per
//! Talos group, gated by the Talos minor releases that have each rule. A kind a release does not
//! register is the schema's business (an unknown `kind`), not this module's. Findings name the
//! document, the YAML path in it and the Talos file of the rule; warnings stay warnings.
//! Imports nothing outside `crate::talos`.

use std::net::IpAddr;

use serde_yaml_ng::Value;

use super::cel::{check_bool, CelEnv};
use super::rules::{at, items, set, text, Findings};
use super::Violation;
use crate::talos::{DocumentId, MachineConfig, TalosVersion};

mod block;
mod container;
mod k8s;
mod network;
mod other;

/// What a kind's rules may look at besides the document itself.
pub(super) struct Ctx {
    pub version: TalosVersion,
}

impl Ctx {
    /// The Talos minor release (11 for 1.11).
    pub fn minor(&self) -> u32 {
        self.version.minor
    }
}

/// One document under check: its value and where findings go.
pub(super) struct Doc<'a, 'o> {
    pub v: &'a Value,
    pub f: Findings<'o>,
    pub rule: &'static str,
}

impl<'a> Doc<'a, '_> {
    pub fn err(&mut self, path: &str, message: impl Into<String>) {
        self.f.error(path, self.rule, message);
    }

    /// An error of a helper validator that lives in another Talos file than the kind's own
    /// (`EncryptionSpec.Validate()` in `block/encryption.go`, ...).
    pub fn err_in(&mut self, rule: &'static str, path: &str, message: impl Into<String>) {
        self.f.error(path, rule, message);
    }

    pub fn warn(&mut self, path: &str, message: impl Into<String>) {
        self.f.warning(path, self.rule, message);
    }

    /// `name` of the document ("" when unset).
    pub fn name(&self) -> &'a str {
        text(self.v, "name")
    }

    pub fn at(&self, path: &str) -> Option<&'a Value> {
        at(self.v, path)
    }

    pub fn text(&self, path: &str) -> &'a str {
        text(self.v, path)
    }

    pub fn items(&self, path: &str) -> &'a [Value] {
        items(self.v, path)
    }

    pub fn set(&self, path: &str) -> bool {
        set(self.v, path)
    }

    /// `name` must be set (Talos' common "name must be specified").
    pub fn require_name(&mut self, message: &str) {
        if self.name().is_empty() {
            self.err("name", message);
        }
    }

    /// Check the CEL expression at `path` (when set) in `env`; `what` prefixes the error as
    /// Talos does ("disk selector is invalid").
    pub fn cel(&mut self, ctx: &Ctx, path: &str, env: CelEnv, what: &str) -> bool {
        let Some(expr) = self.at(path) else {
            return false;
        };
        let Some(src) = expr.as_str() else {
            // The schema reports the type.
            return true;
        };
        if src.is_empty() {
            return false;
        }
        if let Err(e) = check_bool(src, env, ctx.version) {
            self.err(
                path,
                format!(
                    "{what} is invalid: {e} (Talos' {} CEL environment)",
                    env.name()
                ),
            );
        }
        true
    }
}

/// A kind's rules: (kind, first minor, last minor, Talos file, check).
type KindRule = (
    &'static str,
    u32,
    u32,
    &'static str,
    fn(&mut Doc<'_, '_>, &Ctx),
);

/// Run the `Validate()` of every multi-document kind in `config`.
pub(super) fn check(config: &MachineConfig, version: TalosVersion, out: &mut Vec<Violation>) {
    let ctx = Ctx { version };
    let tables: [&[KindRule]; 5] = [
        network::KINDS,
        block::KINDS,
        other::KINDS,
        k8s::KINDS,
        container::KINDS,
    ];
    for d in config.documents() {
        let Some(id) = DocumentId::of(d) else {
            continue;
        };
        if id.is_v1alpha1() || id.api_version != "v1alpha1" {
            continue;
        }
        for table in tables {
            for (kind, first, last, rule, check) in table {
                if *kind == id.kind && (*first..=*last).contains(&version.minor) {
                    let mut doc = Doc {
                        v: d,
                        f: Findings::new(&mut *out, id.to_string()),
                        rule,
                    };
                    check(&mut doc, &ctx);
                }
            }
        }
    }
}

/// The last Talos minor release of a rule that is still there.
pub(super) const NOW: u32 = u32::MAX;

/// An IP address as Go's `netip.ParseAddr` takes it (IPv6 zones included).
pub(super) fn ip_addr(s: &str) -> Option<IpAddr> {
    let plain = s.split_once('%').map_or(s, |(a, _)| a);
    plain.parse().ok()
}

/// A prefix as Go's `netip.ParsePrefix` takes it: `addr/bits`.
pub(super) fn ip_prefix(s: &str) -> Option<(IpAddr, u8)> {
    let (a, b) = s.split_once('/')?;
    let addr: IpAddr = a.parse().ok()?;
    if b.is_empty() || b.len() > 3 || !b.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let bits: u8 = b.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (bits <= max).then_some((addr, bits))
}

/// A Go `time.Duration` in text (`1h2m3.5s`, `-10s`, `0`) as nanoseconds; `None` when Go would
/// not parse it. Numbers in YAML are nanoseconds as Go's YAML decoder reads them.
pub(super) fn go_duration(v: &Value) -> Option<i128> {
    if let Some(n) = v.as_i64() {
        return Some(i128::from(n));
    }
    let s = v.as_str()?;
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        if num.is_empty() || num == "." {
            return None;
        }
        let value: f64 = num.parse().ok()?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += value * scale;
        rest = next;
    }
    let n = total as i128;
    Some(if neg { -n } else { n })
}

/// Whether the duration at `path` is negative.
pub(super) fn negative_duration(d: &Doc<'_, '_>, path: &str) -> bool {
    d.at(path).and_then(go_duration).is_some_and(|n| n < 0)
}

/// Whether no bit of `ip` past the prefix length is set.
pub(super) fn masked(ip: std::net::IpAddr, bits: u8) -> bool {
    match ip {
        std::net::IpAddr::V4(a) => {
            let n = u32::from(a);
            bits >= 32 || n & (u32::MAX >> bits) == 0
        }
        std::net::IpAddr::V6(a) => {
            let n = u128::from(a);
            bits >= 128 || n & (u128::MAX >> bits) == 0
        }
    }
}

/// Only ASCII letters, digits and `-` (Talos' volume name rule).
pub(super) fn volume_name_chars(name: &str) -> bool {
    name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// Talos 1.14's checks of the whole document set (`validateContainer` in
/// `pkg/machinery/config/container/validate.go`): encrypted DNS needs host DNS, discovery needs
/// a cluster identity, KubeSpan needs discovery, a control plane running kube-apiserver needs
/// etcd encryption, and control-plane-only documents stay off workers.
pub(super) fn check_container(
    config: &MachineConfig,
    version: TalosVersion,
    out: &mut Vec<Violation>,
) {
    const R: &str = "pkg/machinery/config/container/validate.go";
    if version.minor < 14 {
        return;
    }
    let v1 = config.v1alpha1();
    let docs: Vec<(DocumentId, &Value)> = config
        .documents()
        .iter()
        .filter_map(|d| DocumentId::of(d).map(|id| (id, d)))
        .filter(|(id, _)| !id.is_v1alpha1())
        .collect();
    let find = |kind: &str| docs.iter().find(|(id, _)| id.kind == kind).map(|(_, d)| *d);
    let mut f = Findings::new(&mut *out, "(config)".into());
    let v1_at = |path: &str| v1.and_then(|d| at(d, path));
    let v1_true = |path: &str| v1_at(path).and_then(Value::as_bool) == Some(true);

    // Host DNS: the ResolverConfig's when it enables it, else the v1alpha1 feature.
    let resolver = find("ResolverConfig");
    let host_dns = resolver
        .filter(|r| at(r, "hostDNS.enabled").and_then(Value::as_bool) == Some(true))
        .is_some()
        || v1_true("machine.features.hostDNS.enabled");
    if let Some(r) = resolver {
        let encrypted = items(r, "nameservers").iter().any(|ns| {
            // Read in any capitalisation, as Talos' decoder does (`correct.rs`).
            !matches!(
                crate::talos::validate::correct::canonical(
                    ns.get("protocol").and_then(Value::as_str).unwrap_or(""),
                    network::DNS_PROTOCOLS
                ),
                "" | "Do53"
            )
        });
        if encrypted && !host_dns {
            f.error(
                "ResolverConfig nameservers",
                R,
                "hostDNS must be enabled when using non-default DNS protocols",
            );
        }
    }

    // Discovery: the v1alpha1 service registry when it is on, else DiscoveryServiceConfig docs.
    let legacy_discovery = v1_true("cluster.discovery.enabled")
        && !v1_true("cluster.discovery.registries.service.disabled");
    let discovery = legacy_discovery || find("DiscoveryServiceConfig").is_some();
    if discovery {
        let (id, secret) = match v1.filter(|d| set(d, "cluster.id") || set(d, "cluster.secret")) {
            Some(d) => (set(d, "cluster.id"), set(d, "cluster.secret")),
            None => match find("DiscoveryIdentityConfig") {
                Some(d) => (set(d, "clusterID"), set(d, "clusterSecret")),
                None => (false, false),
            },
        };
        if !id {
            f.error("cluster.id", R, "cluster ID (.cluster.id or DiscoveryIdentityConfig) should be set when cluster discovery (DiscoveryServiceConfig) is enabled");
        }
        if !secret {
            f.error("cluster.secret", R, "cluster secret (.cluster.secret or DiscoveryIdentityConfig) should be set when cluster discovery (DiscoveryServiceConfig) is enabled");
        }
    }

    // Containers' dependsOn.containers must name configured containers and form a DAG.
    drop(f);
    container::check_dependencies(config, out);
    let mut f = Findings::new(&mut *out, "(config)".into());

    // KubeSpan: the KubeSpanConfig document, else the v1alpha1 section.
    let kubespan = match find("KubeSpanConfig") {
        Some(k) => at(k, "enabled").and_then(Value::as_bool) == Some(true),
        None => v1_true("machine.network.kubespan.enabled"),
    };
    if kubespan && !discovery {
        f.error(
            "KubeSpan",
            R,
            "KubeSpan requires cluster discovery to be enabled",
        );
    }

    let machine_type = v1
        .and_then(|d| at(d, "machine.type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let control_plane = matches!(machine_type, "controlplane" | "init");
    if control_plane {
        let api_ca = find("KubeAPIServerCAConfig").is_some()
            || v1_at("cluster.ca").is_some()
            || v1_at("cluster.acceptedCAs").is_some();
        let legacy_encryption = v1.is_some_and(|d| {
            set(d, "cluster.secretboxEncryptionSecret") || set(d, "cluster.aescbcEncryptionSecret")
        });
        if api_ca && !legacy_encryption && find("KubeEtcdEncryptionConfig").is_none() {
            f.error(
                "cluster.secretboxEncryptionSecret",
                R,
                "etcd encryption config is required for control plane machines running kube-apiserver (.cluster.secretboxEncryptionSecret or a KubeEtcdEncryptionConfig document)",
            );
        }
    }
    const CONTROL_PLANE_ONLY: &[&str] = &[
        "KubeAdmissionControlConfig",
        "KubeAggregatorCAConfig",
        "KubeAPIServerConfig",
        "KubeAuditPolicyConfig",
        "KubeAuthenticationConfig",
        "KubeAuthorizerConfig",
        "KubeControllerManagerConfig",
        "KubeCoreDNSConfig",
        "KubeEtcdEncryptionConfig",
        "KubeFlannelCNIConfig",
        "KubeProxyConfig",
        "KubeSchedulerConfig",
        "KubeServiceAccountConfig",
        "KubeTalosAPIAccessConfig",
    ];
    if !control_plane {
        let mut kinds: Vec<&str> = docs
            .iter()
            .map(|(id, _)| id.kind.as_str())
            .filter(|k| CONTROL_PLANE_ONLY.contains(k))
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        if !kinds.is_empty() {
            f.error(
                "kind",
                R,
                format!(
                    "the following document kinds are only allowed on control plane machines: [{}]",
                    kinds.join(" ")
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let d = |s: &str| go_duration(&Value::String(s.into()));
        assert_eq!(d("1s"), Some(1_000_000_000));
        assert_eq!(d("-1m30s"), Some(-90_000_000_000));
        assert_eq!(d("1.5h"), Some(5_400_000_000_000));
        assert_eq!(d("0"), Some(0));
        assert_eq!(d("10"), None);
        assert_eq!(d("1x"), None);
    }

    #[test]
    fn prefixes() {
        assert!(ip_prefix("10.0.0.0/8").is_some());
        assert!(ip_prefix("fd00::/64").is_some());
        assert!(ip_prefix("10.0.0.0/33").is_none());
        assert!(ip_prefix("10.0.0.0").is_none());
        assert!(ip_addr("fe80::1%eth0").is_some());
    }
}

//! `Validate()` of the network documents (`pkg/machinery/config/types/network/*.go`): links,
//! bonds, bridges, VLANs, VRFs, veths, WireGuard, DHCP, VIPs, static hosts, resolvers, time
//! sync, KubeSpan, routing rules, blackhole routes, probes, firewall rules and BGP.

use std::collections::HashSet;
use std::net::IpAddr;

use base64::Engine;
use serde_yaml_ng::Value;

use super::{go_duration, ip_addr, ip_prefix, masked, negative_duration, Ctx, Doc, KindRule, NOW};
use crate::talos::validate::cel::CelEnv;
use crate::talos::validate::correct::{canonical, fold_enum};
use crate::talos::validate::rules::subnet_or_address;

const LINK: &str = "pkg/machinery/config/types/network/link.go";

// Names of `enumer -text` types that the rules compare; Talos' decoder reads them in any
// capitalisation (pkg/machinery/nethelpers/arpalltargets_enumer.go), so the rules compare
// the name a value decodes to ([`canonical`]).
/// `nethelpers.BondMode`.
const BOND_MODES: &[&str] = &[
    "balance-rr",
    "active-backup",
    "balance-xor",
    "broadcast",
    "802.3ad",
    "balance-tlb",
    "balance-alb",
];
/// The named values of `nethelpers.RoutingTable` (the others are numbers).
const ROUTING_TABLE_NAMES: &[&str] = &["unspec", "default", "main", "local"];
/// `nethelpers.DNSProtocol` (1.14).
pub(super) const DNS_PROTOCOLS: &[&str] = &["Do53", "DoT", "DoH"];

pub(super) const KINDS: &[KindRule] = &[
    ("LinkConfig", 12, NOW, LINK, named_link),
    (
        "DummyLinkConfig",
        12,
        NOW,
        "pkg/machinery/config/types/network/dummy.go",
        named_link,
    ),
    (
        "BridgeConfig",
        12,
        NOW,
        "pkg/machinery/config/types/network/bridge.go",
        named_link,
    ),
    (
        "BondConfig",
        12,
        NOW,
        "pkg/machinery/config/types/network/bond.go",
        bond,
    ),
    (
        "VLANConfig",
        12,
        NOW,
        "pkg/machinery/config/types/network/vlan.go",
        vlan,
    ),
    (
        "VRFConfig",
        13,
        NOW,
        "pkg/machinery/config/types/network/vrf.go",
        vrf,
    ),
    (
        "VethConfig",
        14,
        NOW,
        "pkg/machinery/config/types/network/veth.go",
        veth,
    ),
    (
        "WireguardConfig",
        12,
        NOW,
        "pkg/machinery/config/types/network/wireguard.go",
        wireguard,
    ),
    (
        "LinkAliasConfig",
        12,
        NOW,
        "pkg/machinery/config/types/network/link_alias.go",
        link_alias,
    ),
    (
        "DHCPv4Config",
        12,
        NOW,
        "pkg/machinery/config/types/network/dhcp4.go",
        dhcp,
    ),
    (
        "DHCPv6Config",
        12,
        NOW,
        "pkg/machinery/config/types/network/dhcp6.go",
        dhcp,
    ),
    (
        "Layer2VIPConfig",
        12,
        NOW,
        "pkg/machinery/config/types/network/layer2_vip.go",
        vip,
    ),
    (
        "HCloudVIPConfig",
        12,
        NOW,
        "pkg/machinery/config/types/network/hcloud_vip.go",
        vip,
    ),
    (
        "StaticHostConfig",
        12,
        NOW,
        "pkg/machinery/config/types/network/static_host.go",
        static_host,
    ),
    (
        "ResolverConfig",
        14,
        NOW,
        "pkg/machinery/config/types/network/resolver.go",
        resolver,
    ),
    (
        "TimeSyncConfig",
        12,
        NOW,
        "pkg/machinery/config/types/network/time_sync.go",
        time_sync,
    ),
    (
        "KubeSpanConfig",
        13,
        NOW,
        "pkg/machinery/config/types/network/kubespan.go",
        kubespan,
    ),
    (
        "RoutingRuleConfig",
        13,
        NOW,
        "pkg/machinery/config/types/network/routing_rule.go",
        routing_rule,
    ),
    (
        "BlackholeRouteConfig",
        13,
        NOW,
        "pkg/machinery/config/types/network/blackhole_route.go",
        blackhole,
    ),
    (
        "TCPProbeConfig",
        13,
        NOW,
        "pkg/machinery/config/types/network/tcp_probe.go",
        tcp_probe,
    ),
    (
        "HTTPProbeConfig",
        14,
        NOW,
        "pkg/machinery/config/types/network/http_probe.go",
        http_probe,
    ),
    (
        "EthernetConfig",
        11,
        NOW,
        "pkg/machinery/config/types/network/ethernet.go",
        ethernet,
    ),
    (
        "NetworkRuleConfig",
        11,
        NOW,
        "pkg/machinery/config/types/network/rule_config.go",
        rule_config,
    ),
    (
        "BGPInstanceConfig",
        14,
        NOW,
        "pkg/machinery/config/types/network/bgp.go",
        bgp,
    ),
];

/// `CommonLinkConfig.Validate()`: addresses and routes of any link document (at `base`).
fn common_link(d: &mut Doc<'_, '_>, base: &str) {
    let p = |k: &str| {
        if base.is_empty() {
            k.to_string()
        } else {
            format!("{base}.{k}")
        }
    };
    for (i, a) in d.items(&p("addresses")).iter().enumerate() {
        let path = format!("{}[{i}].address", p("addresses"));
        match a.get("address").and_then(Value::as_str) {
            None | Some("") => d.err_in(LINK, &path, format!("address {i} must be specified")),
            Some(s) => match ip_prefix(s) {
                None => d.err_in(
                    LINK,
                    &path,
                    format!("address {i} must be a valid IP prefix"),
                ),
                Some((ip, _)) if ip.is_unspecified() => d.err_in(
                    LINK,
                    &path,
                    format!("address {i} must be a valid IP address"),
                ),
                Some(_) => {}
            },
        }
    }
    for (i, r) in d.items(&p("routes")).iter().enumerate() {
        let base = format!("{}[{i}]", p("routes"));
        if let Some(s) = r.get("destination").and_then(Value::as_str) {
            if !s.is_empty() && ip_prefix(s).is_none_or(|(ip, _)| ip.is_unspecified()) {
                d.err_in(
                    LINK,
                    &format!("{base}.destination"),
                    format!("route {i} destination must be a valid IP prefix"),
                );
            }
        }
        for (key, what) in [("gateway", "gateway"), ("source", "source")] {
            if let Some(s) = r.get(key).and_then(Value::as_str) {
                if !s.is_empty() && ip_addr(s).is_none_or(|ip| ip.is_unspecified()) {
                    d.err_in(
                        LINK,
                        &format!("{base}.{key}"),
                        format!("route {i} {what} must be a valid IP address"),
                    );
                }
            }
        }
    }
}

fn named_link(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("name must be specified");
    common_link(d, "");
}

fn bond(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("name must be specified");
    if d.items("links").is_empty() {
        d.err("links", "at least one link must be specified");
    }
    // `bondMode` is read case-insensitively (`nethelpers.BondMode`, see `correct.rs`).
    let mode = d
        .at("bondMode")
        .and_then(Value::as_str)
        .map(|m| canonical(m, BOND_MODES));
    match mode {
        None => d.err("bondMode", "bond mode must be specified"),
        Some("802.3ad") => {
            for key in ["miimon", "updelay", "downdelay"] {
                if d.at(key).is_none() {
                    d.warn(key, format!("{key} was not specified for 802.3ad bond"));
                }
            }
        }
        Some(_) => {}
    }
    common_link(d, "");
}

fn vlan(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("name must be specified");
    let id = d.at("vlanID").and_then(Value::as_u64).unwrap_or(0);
    if id == 0 || id > 4094 {
        d.err("vlanID", "vlanID must be specified and between 1 and 4094");
    }
    if d.text("parent").is_empty() {
        d.err("parent", "parent must be specified");
    }
    if let Some(mode) = d.at("vlanMode").and_then(Value::as_str) {
        if fold_enum(mode, &["802.1q", "802.1ad"]).is_none() {
            d.err("vlanMode", "vlanMode must be either '802.1q' or '802.1ad'");
        }
    }
    common_link(d, "");
}

fn vrf(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("name must be specified");
    let table = match d.at("table") {
        None => "unspec".to_string(),
        Some(v) => crate::talos::scalar_text(v).unwrap_or_default(),
    };
    if matches!(
        canonical(&table, ROUTING_TABLE_NAMES),
        "unspec" | "local" | "main" | "default" | ""
    ) {
        d.err(
            "table",
            format!("cannot create vrf with reserved table {table}"),
        );
    }
    common_link(d, "");
}

/// A Linux link name as Talos' veth rule takes it.
fn veth_name(name: &str, field: &str) -> Option<String> {
    if name.is_empty() {
        Some(format!("{field} must be specified"))
    } else if name.len() > 15 {
        Some(format!("{field} must not exceed 15 bytes"))
    } else if name == "." || name == ".." {
        Some(format!("{field} must not be {name:?}"))
    } else if name.contains(['/', ':']) {
        Some(format!("{field} must not contain '/' or ':'"))
    } else if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some(format!(
            "{field} must not contain whitespace or non-printable characters"
        ))
    } else {
        None
    }
}

fn veth(d: &mut Doc<'_, '_>, _: &Ctx) {
    let name = d.name();
    let peer = d.text("peer.name");
    if let Some(e) = veth_name(name, "name") {
        d.err("name", e);
    }
    if let Some(e) = veth_name(peer, "peer name") {
        d.err("peer.name", e);
    }
    if !name.is_empty() && name == peer {
        d.err("peer.name", "name and peer name must be different");
    }
    common_link(d, "");
    common_link(d, "peer");
}

/// A WireGuard key: standard base64 of 32 bytes.
fn wireguard_key(key: &str) -> Result<(), String> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(key)
        .map_err(|e| e.to_string())?;
    if raw.len() != 32 {
        return Err("invalid wireguard key length".into());
    }
    Ok(())
}

fn wireguard(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("name must be specified");
    let key = d.text("privateKey");
    if key.is_empty() {
        d.err("privateKey", "wireguard private key must be specified");
    } else if let Err(e) = wireguard_key(key) {
        d.err(
            "privateKey",
            format!("wireguard private key is invalid: {e}"),
        );
    }
    if let Some(port) = d.at("listenPort").and_then(Value::as_i64) {
        if !(0..=65535).contains(&port) {
            d.err(
                "listenPort",
                "wireguard listen port must be between 0 and 65535",
            );
        }
    }
    for (i, peer) in d.items("peers").iter().enumerate() {
        let base = format!("peers[{i}]");
        let public = peer.get("publicKey").and_then(Value::as_str).unwrap_or("");
        if public.is_empty() {
            d.err(
                &format!("{base}.publicKey"),
                format!("wireguard peer public key must be specified (peer index {i})"),
            );
        } else if let Err(e) = wireguard_key(public) {
            d.err(
                &format!("{base}.publicKey"),
                format!("wireguard peer public key is invalid (peer index {i}): {e}"),
            );
        }
        let psk = peer
            .get("presharedKey")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !psk.is_empty() {
            if let Err(e) = wireguard_key(psk) {
                d.err(
                    &format!("{base}.presharedKey"),
                    format!("wireguard peer preshared key is invalid (peer index {i}): {e}"),
                );
            }
        }
        if peer
            .get("persistentKeepaliveInterval")
            .and_then(go_duration)
            .is_some_and(|n| n < 0)
        {
            d.err(
                &format!("{base}.persistentKeepaliveInterval"),
                format!(
                    "wireguard peer persistent keepalive interval cannot be negative (peer index {i})"
                ),
            );
        }
    }
    common_link(d, "");
}

fn link_alias(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    let name = d.name();
    if name.is_empty() {
        d.err("name", "name must be specified");
    } else if ctx.minor() >= 13 && name.contains('%') {
        // A pattern alias (`net%d`) names links by a counter: only the `%d` verb is allowed.
        let (prefix, suffix) = name.split_once('%').unwrap_or((name, ""));
        if suffix != "d" || prefix.is_empty() {
            d.err(
                "name",
                format!("name {name:?} contains an invalid format verb, use %d suffix"),
            );
        }
    }
    if !d.cel(ctx, "selector.match", CelEnv::Link, "link selector") {
        d.err("selector.match", "link selector is required");
    }
}

fn dhcp(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("name must be specified");
    let duid = canonical(d.text("clientIdentifier"), &["none", "mac", "duid"]) == "duid";
    let raw = d.set("duidRaw");
    if raw && !duid {
        d.err(
            "duidRaw",
            "duidRaw can only be set if clientIdentifier is 'duid'",
        );
    }
    if duid && !raw {
        d.err(
            "duidRaw",
            "duidRaw must be set if clientIdentifier is 'duid'",
        );
    }
}

fn vip(d: &mut Doc<'_, '_>, _: &Ctx) {
    let name = d.name();
    if name.is_empty() {
        d.err("name", "name must be specified");
    } else if ip_addr(name).is_none() {
        d.err(
            "name",
            format!("name must be a valid IP address: {name:?} is not one"),
        );
    }
    if d.text("link").is_empty() {
        d.err("link", "link must be specified");
    }
    if d.v.get("kind").and_then(Value::as_str) == Some("HCloudVIPConfig")
        && d.text("apiToken").is_empty()
    {
        d.err("apiToken", "apiToken must be specified");
    }
}

fn static_host(d: &mut Doc<'_, '_>, _: &Ctx) {
    let name = d.name();
    if name.is_empty() {
        d.err("name", "name is required");
    }
    if ip_addr(name).is_none() {
        d.err("name", "name must be a valid IP address");
    }
    if d.items("hostnames").is_empty() {
        d.err("hostnames", "at least one hostname is required");
    }
}

fn resolver(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.set("hostDNS") && d.at("hostDNS.enabled").and_then(Value::as_bool) != Some(true) {
        for (key, what) in [
            ("forwardKubeDNSToHost", "forwardKubeDNSToHost"),
            ("resolveMemberNames", "resolveMemberNames"),
        ] {
            if d.at(&format!("hostDNS.{key}")).and_then(Value::as_bool) == Some(true) {
                d.err(
                    &format!("hostDNS.{key}"),
                    format!("hostDNS.{what} cannot be enabled when hostDNS.enabled is false"),
                );
            }
        }
    }
    let servers = d.items("nameservers");
    let mut encrypted = 0;
    for (i, ns) in servers.iter().enumerate() {
        let base = format!("nameservers[{i}]");
        let tls = ns
            .get("tlsServerName")
            .and_then(Value::as_str)
            .unwrap_or("");
        let protocol = ns.get("protocol").and_then(Value::as_str).unwrap_or("");
        match canonical(protocol, DNS_PROTOCOLS) {
            name @ ("DoT" | "DoH") => {
                encrypted += 1;
                if tls.is_empty() {
                    d.err(
                        &format!("{base}.tlsServerName"),
                        format!("tlsServerName must be set when protocol is {name}: entry {i}"),
                    );
                }
            }
            "" | "Do53" => {
                if !tls.is_empty() {
                    d.err(
                        &format!("{base}.tlsServerName"),
                        format!("tlsServerName must be empty when protocol is Do53: entry {i}"),
                    );
                }
            }
            _ => d.err(
                &format!("{base}.protocol"),
                format!("unsupported DNS protocol: entry {i}"),
            ),
        }
        let addr = ns.get("address").and_then(Value::as_str).unwrap_or("");
        if ip_addr(addr).is_none() {
            d.err(
                &format!("{base}.address"),
                format!("nameserver address must be a valid IP: entry {i}"),
            );
        }
    }
    if encrypted > 0 && encrypted == servers.len() {
        d.warn(
            "nameservers",
            "all configured nameservers use encrypted DNS (DoT or DoH): certificate checks need a correct clock, so boot may stall when NTP servers are named by hostname; keep one plain-DNS server or name NTP servers by IP address",
        );
    }
}

fn time_sync(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    if negative_duration(d, "bootTimeout") {
        d.err("bootTimeout", "bootTimeout cannot be negative");
    }
    if d.at("ntp").is_some() && d.at("ptp").is_some() {
        d.err(
            "ptp",
            "only one of ntp or ptp configuration can be specified",
        );
    }
    if ctx.minor() >= 14 && d.at("ntp.useNTS").and_then(Value::as_bool) == Some(true) {
        for (i, s) in d.items("ntp.servers").iter().enumerate() {
            let s = s.as_str().unwrap_or("");
            if s.parse::<std::net::IpAddr>().is_ok() {
                d.err(
                    &format!("ntp.servers[{i}]"),
                    format!("NTS requires hostnames, not IP addresses: {s:?}"),
                );
            }
        }
    }
}

fn kubespan(d: &mut Doc<'_, '_>, _: &Ctx) {
    if let Some(mtu) = d.at("mtu").and_then(Value::as_u64) {
        if mtu < 1280 {
            d.err("mtu", "kubespan link MTU must be at least 1280");
        }
    }
    for (i, c) in d.items("filters.endpoints").iter().enumerate() {
        let c = c.as_str().unwrap_or("");
        if !subnet_or_address(c.trim_start_matches('!')) {
            d.err(
                &format!("filters.endpoints[{i}]"),
                format!("KubeSpan endpoint filter is not valid: {c:?}"),
            );
        }
    }
}

fn routing_rule(d: &mut Doc<'_, '_>, _: &Ctx) {
    let name = d.name();
    if name.is_empty() {
        d.err("name", "name must be specified");
    }
    match name.parse::<u32>() {
        Err(e) => d.err(
            "name",
            format!("invalid name: must be priority parsable unsigned integer: {e}"),
        ),
        Ok(p) if [0, 32500, 32766, 32767].contains(&p) => d.err(
            "name",
            "priority must be between 1 and 32765 (excluding reserved priorities [0 32500 32766 32767])",
        ),
        Ok(_) => {}
    }
    let table = d
        .at("table")
        .and_then(crate::talos::scalar_text)
        .unwrap_or_else(|| "unspec".into());
    let action = d.text("action");
    if canonical(&table, ROUTING_TABLE_NAMES) == "unspec"
        && matches!(
            canonical(action, &["unspec", "unicast"]),
            "" | "unspec" | "unicast"
        )
    {
        d.err(
            "table",
            "either table or a non-unicast action must be specified",
        );
    }
    let mark = d.at("fwMark").and_then(Value::as_u64).unwrap_or(0);
    let mask = d.at("fwMask").and_then(Value::as_u64).unwrap_or(0);
    if mask != 0 && mark == 0 {
        d.err("fwMask", "fwMask requires fwMark to be set");
    }
}

fn blackhole(d: &mut Doc<'_, '_>, _: &Ctx) {
    let name = d.name();
    if name.is_empty() {
        d.err("name", "name must be specified");
    }
    if ip_prefix(name).is_none() {
        d.err("name", "name must be a valid address prefix");
    }
}

fn probe_common(d: &mut Doc<'_, '_>) {
    if negative_duration(d, "interval") {
        d.err_in(
            "pkg/machinery/config/types/network/tcp_probe.go",
            "interval",
            "probe interval cannot be negative",
        );
    }
    if d.at("failureThreshold")
        .and_then(Value::as_i64)
        .unwrap_or(0)
        < 0
    {
        d.err_in(
            "pkg/machinery/config/types/network/tcp_probe.go",
            "failureThreshold",
            "probe failure threshold cannot be negative",
        );
    }
}

fn tcp_probe(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("probe name is required");
    if d.text("endpoint").is_empty() {
        d.err("endpoint", "TCP probe endpoint is required");
    }
    if negative_duration(d, "timeout") {
        d.err("timeout", "TCP probe timeout cannot be negative");
    }
    probe_common(d);
}

fn http_probe(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("probe name is required");
    let u = d.text("url");
    if u.is_empty() {
        d.err("url", "HTTP probe URL is required");
    } else {
        match url::Url::parse(u) {
            Ok(parsed) if !matches!(parsed.scheme(), "http" | "https") => d.err(
                "url",
                format!(
                    "HTTP probe URL scheme must be http or https, got {:?}",
                    parsed.scheme()
                ),
            ),
            Ok(parsed) if parsed.host_str().is_none_or(str::is_empty) => d.err(
                "url",
                "HTTP probe URL must be an absolute http or https URL with a non-empty host",
            ),
            Ok(_) => {}
            Err(_) => d.err(
                "url",
                "HTTP probe URL must be an absolute http or https URL with a non-empty host",
            ),
        }
    }
    if negative_duration(d, "timeout") {
        d.err("timeout", "HTTP probe timeout cannot be negative");
    }
    probe_common(d);
}

fn ethernet(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("name is required");
}

/// A port range `80` or `1000-2000` as (lo, hi).
fn port_range(v: &Value) -> Option<(u64, u64)> {
    if let Some(n) = v.as_u64() {
        return Some((n, n));
    }
    let s = v.as_str()?;
    match s.split_once('-') {
        Some((a, b)) => Some((a.trim().parse().ok()?, b.trim().parse().ok()?)),
        None => s.trim().parse().ok().map(|n| (n, n)),
    }
}

fn rule_config(d: &mut Doc<'_, '_>, _: &Ctx) {
    // Talos stops at the first problem of this kind.
    if d.name().is_empty() {
        return d.err("name", "name is required");
    }
    let ports = d.items("portSelector.ports");
    if ports.is_empty() {
        return d.err("portSelector.ports", "portSelector.ports is required");
    }
    let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        if let Some((lo, hi)) = port_range(p) {
            ranges.push((lo, hi, i));
        }
    }
    ranges.sort_by_key(|r| r.0);
    for (k, (lo, hi, i)) in ranges.iter().enumerate() {
        if lo > hi {
            return d.err(
                &format!("portSelector.ports[{i}]"),
                format!("invalid port range: {lo}-{hi}"),
            );
        }
        if k > 0 {
            let (plo, phi, _) = ranges[k - 1];
            if *lo == plo || *lo <= phi {
                return d.err(
                    &format!("portSelector.ports[{i}]"),
                    format!("invalid port range: {lo}-{hi}, overlaps with {plo}-{phi}"),
                );
            }
        }
    }
    for (i, rule) in d.items("ingress").iter().enumerate() {
        let subnet = rule.get("subnet").and_then(Value::as_str).unwrap_or("");
        if ip_prefix(subnet).is_none() {
            return d.err(
                &format!("ingress[{i}].subnet"),
                format!("invalid subnet: {subnet:?}"),
            );
        }
        if let Some(except) = rule.get("except").and_then(Value::as_str) {
            if !except.is_empty() && ip_prefix(except).is_none() {
                return d.err(
                    &format!("ingress[{i}].except"),
                    format!("invalid except: {except:?}"),
                );
            }
        }
    }
}

fn bgp(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("name must be specified");
    if d.at("localASN").and_then(Value::as_u64).unwrap_or(0) == 0 {
        d.err("localASN", "localASN must be specified");
    }
    let router = d.text("routerID");
    if !router.is_empty() && ip_addr(router).is_some_and(|ip| !ip.is_ipv4()) {
        d.err("routerID", "routerID must be an IPv4 address");
    }
    let neighbors = d.items("neighbors");
    if neighbors.is_empty() {
        d.warn("neighbors", "BGPInstanceConfig has no neighbors configured");
    }
    let vrf = !d.text("vrf").is_empty();
    let mut seen = HashSet::new();
    for (i, n) in neighbors.iter().enumerate() {
        let base = format!("neighbors[{i}]");
        // A neighbor is keyed by its address (as netip prints it) or its link: exactly one.
        let address = n
            .get("address")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
            .and_then(ip_addr);
        let link = n.get("link").and_then(Value::as_str).unwrap_or("");
        match (address, link.is_empty()) {
            (Some(a), true) => {
                if !seen.insert(a.to_string()) {
                    d.err(&base, format!("neighbor[{i}]: duplicate neighbor \"{a}\""));
                }
            }
            (None, false) => {
                if !seen.insert(link.to_string()) {
                    d.err(&base, format!("neighbor[{i}]: duplicate neighbor {link:?}"));
                }
            }
            _ => d.err(
                &base,
                format!("neighbor[{i}]: exactly one of address or link must be set"),
            ),
        }
        if n.get("holdTime")
            .and_then(go_duration)
            .is_some_and(|t| t < 0)
        {
            d.err(
                &format!("{base}.holdTime"),
                format!("neighbor[{i}]: holdTime must not be negative"),
            );
        }
        let Some(bfd) = n.get("bfd").filter(|b| !b.is_null()) else {
            continue;
        };
        if vrf {
            d.err(
                &format!("{base}.bfd"),
                format!("neighbor[{i}]: bfd is not supported for VRF-bound BGP instances"),
            );
        }
        for key in ["transmitInterval", "receiveInterval"] {
            if bfd.get(key).and_then(go_duration).is_some_and(|t| t < 0) {
                d.err(
                    &format!("{base}.bfd.{key}"),
                    format!("neighbor[{i}]: bfd.{key} must not be negative"),
                );
            }
        }
    }
    let name = d.name();
    let mut sources = HashSet::new();
    // Masked prefixes of earlier routes, for the overlap check across routes.
    let mut selectors: Vec<(IpAddr, u8, usize)> = Vec::new();
    for (i, route) in d.items("importRoutes").iter().enumerate() {
        let base = format!("importRoutes[{i}]");
        let src = route
            .get("bgpInstance")
            .and_then(Value::as_str)
            .unwrap_or("");
        if src.is_empty() {
            d.err(
                &format!("{base}.bgpInstance"),
                format!("importRoutes[{i}]: bgpInstance must be specified"),
            );
        } else {
            if src == name {
                d.err(
                    &format!("{base}.bgpInstance"),
                    format!("importRoutes[{i}]: cannot import from the same BGP instance {name:?}"),
                );
            }
            if !sources.insert(src.to_string()) {
                d.err(
                    &format!("{base}.bgpInstance"),
                    format!("importRoutes[{i}]: duplicate source BGP instance {src:?}"),
                );
            }
        }
        let prefixes = route
            .get("prefixes")
            .and_then(Value::as_sequence)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if prefixes.is_empty() {
            d.err(
                &format!("{base}.prefixes"),
                format!("importRoutes[{i}]: at least one prefix must be specified"),
            );
        }
        let parsed: Vec<Option<(IpAddr, u8)>> = prefixes
            .iter()
            .map(|p| p.as_str().and_then(ip_prefix))
            .collect();
        for (j, p) in parsed.iter().enumerate() {
            let at = format!("{base}.prefixes[{j}]");
            let Some((ip, bits)) = *p else {
                d.err(
                    &at,
                    format!("importRoutes[{i}].prefixes[{j}]: invalid prefix"),
                );
                continue;
            };
            let shown = format!("{ip}/{bits}");
            if !masked(ip, bits) {
                d.err(
                    &at,
                    format!("importRoutes[{i}].prefixes[{j}]: prefix {shown} must be masked"),
                );
            }
            for (k, other) in parsed.iter().enumerate().take(j) {
                if let Some((oip, obits)) = *other {
                    if prefixes_overlap((oip, obits), (ip, bits)) {
                        d.err(
                            &at,
                            format!("importRoutes[{i}].prefixes[{j}]: prefix {shown} overlaps prefixes[{k}] {oip}/{obits}"),
                        );
                    }
                }
            }
        }
        // Across routes only masked prefixes count; Talos reports each overlap with an earlier
        // route's prefix.
        for (ip, bits) in parsed.iter().flatten().copied() {
            if !masked(ip, bits) {
                continue;
            }
            for (sip, sbits, route_index) in &selectors {
                if *route_index != i && prefixes_overlap((*sip, *sbits), (ip, bits)) {
                    d.err(
                        &format!("{base}.prefixes"),
                        format!("importRoutes[{i}]: prefix {ip}/{bits} overlaps importRoutes[{route_index}] prefix {sip}/{sbits}"),
                    );
                }
            }
            selectors.push((ip, bits, i));
        }
    }
}

/// Whether two prefixes of one address family share an address (`prefixesOverlap` of
/// `network/bgp.go`: either contains the other's address).
fn prefixes_overlap(a: (IpAddr, u8), b: (IpAddr, u8)) -> bool {
    let contains = |(net, bits): (IpAddr, u8), ip: IpAddr| match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(x)) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(bits))
            };
            u32::from(n) & mask == u32::from(x) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(x)) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(bits))
            };
            u128::from(n) & mask == u128::from(x) & mask
        }
        _ => false,
    };
    a.0.is_ipv4() == b.0.is_ipv4() && (contains(a, b.0) || contains(b, a.0))
}

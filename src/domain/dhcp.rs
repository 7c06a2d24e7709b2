//! Network-boot facts of DHCP, with no sockets: who is asking (firmware class from options 93, 60
//! and 77), what it should boot, address pools, and the subnet a request belongs to.
//!
//! Wire decoding lives in `crate::dhcp`; lease decisions in `crate::service::provisioning::dhcp`.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

/// CPU architecture of a booting client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// x86-64 (iPXE says `i386` or `x86_64`).
    Amd64,
    /// AArch64.
    Arm64,
}

/// What kind of firmware sent a request, decided from its own options.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootClient {
    /// Legacy BIOS PXE ROM (option 93 = 0).
    BiosPxe,
    /// UEFI PXE (option 93 = 7 or 9 for x86-64, 11 for ARM64).
    UefiPxe(Arch),
    /// UEFI HTTP boot (option 93 = 16 x86-64, 19 ARM64; vendor class `HTTPClient`).
    UefiHttp(Arch),
    /// A client already running iPXE (option 77 `iPXE`).
    Ipxe(Arch),
    /// Anything else: an installed OS renewing its lease, a phone, a printer.
    Plain,
}

impl fmt::Display for BootClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootClient::BiosPxe => f.write_str("bios-pxe"),
            BootClient::UefiPxe(a) => write!(f, "uefi-pxe-{a:?}"),
            BootClient::UefiHttp(a) => write!(f, "uefi-http-{a:?}"),
            BootClient::Ipxe(a) => write!(f, "ipxe-{a:?}"),
            BootClient::Plain => f.write_str("plain"),
        }
    }
}

/// Classify a client from option 93 (RFC 4578 section 2.1, IANA processor architecture types),
/// option 60 (vendor class: `PXEClient...` or `HTTPClient...`) and option 77 (user class `iPXE`).
pub fn classify(
    arch: Option<u16>,
    vendor_class: Option<&[u8]>,
    user_class: Option<&[u8]>,
) -> BootClient {
    let vendor = vendor_class.unwrap_or_default();
    let pxe = vendor.starts_with(b"PXEClient");
    let http = vendor.starts_with(b"HTTPClient");
    let arch_of = |code: u16| match code {
        11 | 19 => Arch::Arm64,
        _ => Arch::Amd64,
    };
    // RFC 3004: user class is a list of (length, data); iPXE sends a bare "iPXE" as well.
    let is_ipxe = user_class.is_some_and(|u| u == b"iPXE" || (u.len() > 1 && &u[1..] == b"iPXE"));
    if is_ipxe {
        return BootClient::Ipxe(arch.map_or(Arch::Amd64, arch_of));
    }
    match arch {
        Some(16) => BootClient::UefiHttp(Arch::Amd64),
        Some(19) => BootClient::UefiHttp(Arch::Arm64),
        Some(_) if http => BootClient::UefiHttp(arch.map_or(Arch::Amd64, arch_of)),
        Some(0) if pxe || vendor.is_empty() => BootClient::BiosPxe,
        Some(6 | 7 | 9) => BootClient::UefiPxe(Arch::Amd64),
        Some(11) => BootClient::UefiPxe(Arch::Arm64),
        None if pxe => BootClient::BiosPxe,
        _ => BootClient::Plain,
    }
}

/// Where the boot files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootFiles {
    /// Base URL of Plinth's HTTP front door as clients reach it, e.g. `http://10.0.0.1:8080`.
    pub http_base: String,
}

/// What a network-booting client is told to load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootAnswer {
    /// Boot file name (option 67 and the `file` field): a TFTP path or an `http://` URL.
    pub file: String,
    /// Echo option 60 `HTTPClient` (UEFI HTTP boot needs it to accept the offer).
    pub http_client: bool,
}

/// An iPXE binary Plinth hands to network-booting firmware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpxeBinary {
    /// File name in the iPXE directory (TFTP path, and `/ipxe/{file}` over HTTP).
    pub file: &'static str,
    /// The firmware it boots, as reported at start-up (`bios`, `uefi-x86_64`, ...).
    pub boots: &'static str,
    /// The firmware class that is handed this file (`None`: present only as an alternative that
    /// an operator may point firmware at by hand, never chosen by Plinth).
    pub chosen_for: Option<Firmware>,
}

/// Which firmware a boot file is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Firmware {
    /// Legacy BIOS (PXE ROM).
    Bios,
    /// UEFI of an architecture (PXE or HTTP boot).
    Uefi(Arch),
}

/// Every iPXE binary Plinth knows, in one table: what DHCP hands out, what TFTP and
/// `/ipxe/{file}` serve, and what start-up reports as bootable.
pub const IPXE_BINARIES: [IpxeBinary; 4] = [
    IpxeBinary {
        file: "undionly.kpxe",
        boots: "bios",
        chosen_for: Some(Firmware::Bios),
    },
    IpxeBinary {
        file: "ipxe.efi",
        boots: "uefi-x86_64",
        chosen_for: Some(Firmware::Uefi(Arch::Amd64)),
    },
    IpxeBinary {
        file: "snponly.efi",
        boots: "uefi-x86_64-snp",
        chosen_for: None,
    },
    IpxeBinary {
        file: "ipxe-arm64.efi",
        boots: "uefi-arm64",
        chosen_for: Some(Firmware::Uefi(Arch::Arm64)),
    },
];

/// The iPXE binary Plinth hands to `firmware`.
pub fn ipxe_binary(firmware: Firmware) -> &'static str {
    IPXE_BINARIES
        .iter()
        .find(|b| b.chosen_for == Some(firmware))
        .map_or("ipxe.efi", |b| b.file)
}

impl BootFiles {
    /// The boot file for a client. `None` for clients that do not network-boot.
    pub fn answer(&self, client: BootClient) -> Option<BootAnswer> {
        let base = self.http_base.trim_end_matches('/');
        let tftp = |f: Firmware| {
            Some(BootAnswer {
                file: ipxe_binary(f).to_string(),
                http_client: false,
            })
        };
        match client {
            BootClient::BiosPxe => tftp(Firmware::Bios),
            BootClient::UefiPxe(a) => tftp(Firmware::Uefi(a)),
            BootClient::UefiHttp(a) => Some(BootAnswer {
                file: format!("{base}/ipxe/{}", ipxe_binary(Firmware::Uefi(a))),
                http_client: true,
            }),
            // Already iPXE: straight to the script, never back into iPXE (no chainloading loop).
            BootClient::Ipxe(_) => Some(BootAnswer {
                file: format!("{base}/boot.ipxe"),
                http_client: false,
            }),
            BootClient::Plain => None,
        }
    }
}

/// The subnets whose UEFI HTTP boot clients cannot resolve the boot URL: `http_base` names its
/// host by a DNS name (not an IPv4 literal) and the subnet is Plinth's own (authoritative) but
/// gives no DNS server (option 6). EDK2's HttpBootDxe resolves the URL's host with the DNS
/// servers of the DHCP answer it took, and without one it cannot fetch the boot file.
pub fn unresolvable_http_boot<'a>(http_base: &str, subnets: &'a [Subnet]) -> Vec<&'a Subnet> {
    let host = http_base
        .split_once("://")
        .map_or(http_base, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let name = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    if name.is_empty() || name.starts_with('[') || name.parse::<Ipv4Addr>().is_ok() {
        return Vec::new();
    }
    subnets
        .iter()
        .filter(|s| s.mode == SubnetMode::Authoritative && s.dns.is_empty())
        .collect()
}

/// How Plinth serves a subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubnetMode {
    /// Plinth owns the addresses.
    Authoritative,
    /// Another server owns the addresses; Plinth only adds boot information (proxyDHCP).
    Proxy,
    /// Not served.
    Off,
}

/// An inclusive address range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Range {
    /// First address.
    pub first: Ipv4Addr,
    /// Last address.
    pub last: Ipv4Addr,
}

impl Ipv4Range {
    /// Does it contain `ip`?
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.first <= ip && ip <= self.last
    }

    /// Number of addresses.
    pub fn len(&self) -> u64 {
        u64::from(u32::from(self.last)) - u64::from(u32::from(self.first)) + 1
    }

    /// Never empty (first <= last is checked on parse).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Addresses in order.
    pub fn iter(&self) -> impl Iterator<Item = Ipv4Addr> {
        (u32::from(self.first)..=u32::from(self.last)).map(Ipv4Addr::from)
    }
}

impl FromStr for Ipv4Range {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, b) = s
            .split_once('-')
            .ok_or_else(|| format!("`{s}` is not a range FIRST-LAST"))?;
        let first: Ipv4Addr = a
            .trim()
            .parse()
            .map_err(|_| format!("`{a}` is not an IPv4 address"))?;
        let last: Ipv4Addr = b
            .trim()
            .parse()
            .map_err(|_| format!("`{b}` is not an IPv4 address"))?;
        if first > last {
            return Err(format!("`{s}`: the first address is after the last"));
        }
        Ok(Ipv4Range { first, last })
    }
}

/// A served subnet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subnet {
    /// The network, e.g. 10.0.0.0/24.
    pub net: Ipv4Net,
    /// How it is served.
    pub mode: SubnetMode,
    /// Plinth's address on this subnet (option 54, `siaddr`, TFTP next-server).
    pub server_ip: Ipv4Addr,
    /// Dynamic pool (authoritative mode).
    pub pool: Vec<Ipv4Range>,
    /// Option 3.
    pub routers: Vec<Ipv4Addr>,
    /// Option 6.
    pub dns: Vec<Ipv4Addr>,
    /// Option 42.
    pub ntp: Vec<Ipv4Addr>,
    /// Option 15.
    pub domain: Option<String>,
    /// Option 51, seconds.
    pub lease_seconds: u32,
    /// Addresses relayed requests for this subnet may come from (the relay agents' own
    /// addresses, as UDP sources). A request whose `giaddr` names this subnet from anywhere else is
    /// not answered: anyone on a local segment can write a `giaddr`.
    pub relay_agents: Vec<Ipv4Addr>,
    /// Share of the pool that clients the inventory does not know may hold at once, in
    /// thousandths (0-1000).
    pub unknown_permille: u16,
    /// Addresses one relay circuit (option 82 circuit id: a switch port) may hold at once.
    pub leases_per_circuit: u32,
    /// IPv6 router advertisements on this subnet's link (`ipv6_ra`), or none.
    pub router_advert: Option<RouterAdvert>,
}

/// What Plinth's IPv6 router advertisements (RFC 4861 section 4.2) on a provisioning link say:
/// router lifetime 0 (not a default router), managed and other-configuration flags clear (no
/// DHCPv6), and no prefix unless `prefixes` names some (each advertised on-link and for
/// autonomous address configuration). Their purpose is that a host waiting for a router
/// advertisement before it settles IPv6 (iPXE) finishes at once instead of timing out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouterAdvert {
    /// Prefix information options (RFC 4861 section 4.6.2), /64 each.
    pub prefixes: Vec<ipnet::Ipv6Net>,
}

impl Subnet {
    /// The subnet's key in the lease table.
    pub fn key(&self) -> String {
        self.net.to_string()
    }

    /// Is `ip` a usable host address of this subnet (not network, not broadcast)?
    pub fn is_host(&self, ip: Ipv4Addr) -> bool {
        self.net.contains(&ip) && ip != self.net.network() && ip != self.net.broadcast()
    }

    /// Is `ip` in the dynamic pool?
    pub fn in_pool(&self, ip: Ipv4Addr) -> bool {
        self.pool.iter().any(|r| r.contains(ip))
    }
}

/// Why a request belongs to no subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoSubnet {
    /// No configured subnet matches.
    Unknown,
    /// A `giaddr` that names a subnet, from an address that is not one of its relay agents.
    UntrustedRelay,
}

impl NoSubnet {
    /// The drop reason counted for it.
    pub fn reason(self) -> &'static str {
        match self {
            NoSubnet::Unknown => "no_subnet",
            NoSubnet::UntrustedRelay => "relay_not_trusted",
        }
    }
}

/// The subnet a request belongs to (RFC 2131 section 4.3.1): the relay's `giaddr` when set (and
/// the datagram came from one of that subnet's relay agents, or the subnet is on the arrival
/// interface and the relay sent from its `giaddr` itself, as a relay on the same segment does),
/// else the client's `ciaddr` when set
/// (a subnet of the arrival interface, or a relayed one), else the subnet of the interface it
/// arrived on (`local`: that interface's addresses only).
pub fn select_subnet<'a, S: AsRef<Subnet>>(
    subnets: &'a [S],
    giaddr: Ipv4Addr,
    ciaddr: Ipv4Addr,
    local: &[Ipv4Addr],
    source: Ipv4Addr,
) -> Result<&'a S, NoSubnet> {
    let by = |ip: Ipv4Addr| subnets.iter().find(|s| s.as_ref().net.contains(&ip));
    if !giaddr.is_unspecified() {
        let found = by(giaddr).ok_or(NoSubnet::Unknown)?;
        let s = found.as_ref();
        let on_segment = giaddr == source && local.iter().any(|ip| s.net.contains(ip));
        return if s.relay_agents.contains(&source) || on_segment {
            Ok(found)
        } else {
            Err(NoSubnet::UntrustedRelay)
        };
    }
    if !ciaddr.is_unspecified() {
        if let Some(found) = by(ciaddr) {
            let s = found.as_ref();
            let here = local.iter().any(|ip| s.net.contains(ip));
            if here || !s.relay_agents.is_empty() {
                return Ok(found);
            }
        }
    }
    local
        .iter()
        .find_map(|ip| {
            subnets.iter().find(|s| {
                let s = s.as_ref();
                s.net.contains(ip) && s.server_ip == *ip
            })
        })
        .or_else(|| local.iter().find_map(|ip| by(*ip)))
        .ok_or(NoSubnet::Unknown)
}

impl AsRef<Subnet> for Subnet {
    fn as_ref(&self) -> &Subnet {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_table() {
        type Case<'a> = (Option<u16>, &'a [u8], &'a [u8], BootClient);
        let cases: &[Case] = &[
            (
                Some(0),
                b"PXEClient:Arch:00000:UNDI:002001",
                b"",
                BootClient::BiosPxe,
            ),
            (
                Some(7),
                b"PXEClient:Arch:00007:UNDI:003016",
                b"",
                BootClient::UefiPxe(Arch::Amd64),
            ),
            (
                Some(9),
                b"PXEClient:Arch:00009:UNDI:003016",
                b"",
                BootClient::UefiPxe(Arch::Amd64),
            ),
            (
                Some(11),
                b"PXEClient:Arch:00011:UNDI:003000",
                b"",
                BootClient::UefiPxe(Arch::Arm64),
            ),
            (
                Some(16),
                b"HTTPClient:Arch:00016:UNDI:003001",
                b"",
                BootClient::UefiHttp(Arch::Amd64),
            ),
            (
                Some(19),
                b"HTTPClient:Arch:00019:UNDI:003001",
                b"",
                BootClient::UefiHttp(Arch::Arm64),
            ),
            (
                Some(0),
                b"PXEClient:Arch:00000:UNDI:002001",
                b"iPXE",
                BootClient::Ipxe(Arch::Amd64),
            ),
            (
                Some(7),
                b"PXEClient",
                b"\x04iPXE",
                BootClient::Ipxe(Arch::Amd64),
            ),
            (
                Some(11),
                b"PXEClient",
                b"iPXE",
                BootClient::Ipxe(Arch::Arm64),
            ),
            (None, b"", b"", BootClient::Plain),
            (None, b"udhcp 1.35.0", b"", BootClient::Plain),
        ];
        for (arch, vendor, user, want) in cases {
            let got = classify(*arch, Some(vendor), (!user.is_empty()).then_some(*user));
            assert_eq!(
                got,
                *want,
                "{arch:?} {:?} {:?}",
                String::from_utf8_lossy(vendor),
                String::from_utf8_lossy(user)
            );
        }
    }

    #[test]
    fn boot_files_per_client() {
        let b = BootFiles {
            http_base: "http://10.0.0.1:8080/".into(),
        };
        assert_eq!(
            b.answer(BootClient::BiosPxe).map(|a| a.file),
            Some("undionly.kpxe".into())
        );
        assert_eq!(
            b.answer(BootClient::UefiPxe(Arch::Amd64)).map(|a| a.file),
            Some("ipxe.efi".into())
        );
        let http = b.answer(BootClient::UefiHttp(Arch::Amd64)).expect("http");
        assert_eq!(http.file, "http://10.0.0.1:8080/ipxe/ipxe.efi");
        assert!(http.http_client);
        assert_eq!(
            b.answer(BootClient::Ipxe(Arch::Arm64)).map(|a| a.file),
            Some("http://10.0.0.1:8080/boot.ipxe".into())
        );
        assert_eq!(b.answer(BootClient::Plain), None);
    }

    #[test]
    fn a_boot_url_by_name_needs_a_dns_server() {
        let s = |mode: SubnetMode, dns: &[&str]| Subnet {
            net: "10.0.0.0/24".parse().expect("net"),
            mode,
            server_ip: "10.0.0.1".parse().expect("ip"),
            pool: vec![],
            routers: vec![],
            dns: dns.iter().map(|d| d.parse().expect("ip")).collect(),
            ntp: vec![],
            domain: None,
            lease_seconds: 3600,
            relay_agents: vec![],
            unknown_permille: 500,
            leases_per_circuit: 4,
            router_advert: None,
        };
        let subnets = vec![
            s(SubnetMode::Authoritative, &[]),
            s(SubnetMode::Authoritative, &["10.0.0.53"]),
            s(SubnetMode::Proxy, &[]),
        ];
        let bad = |url: &str| unresolvable_http_boot(url, &subnets).len();
        assert_eq!(bad("http://plinth.example:8080"), 1);
        assert_eq!(bad("http://plinth.example/"), 1);
        assert_eq!(bad("https://user@plinth.example:443/x"), 1);
        assert_eq!(
            bad("http://10.0.0.1:8080"),
            0,
            "an IPv4 literal needs no DNS"
        );
        assert_eq!(bad("http://10.0.0.1"), 0);
        assert_eq!(bad("http://[fd00::1]:8080"), 0);
    }

    #[test]
    fn ranges_and_subnets() {
        let r: Ipv4Range = "10.0.0.10-10.0.0.12".parse().expect("range");
        assert_eq!(r.iter().count(), 3);
        assert!("10.0.0.12-10.0.0.10".parse::<Ipv4Range>().is_err());
        let s = |net: &str, server: &str| Subnet {
            net: net.parse().expect("net"),
            mode: SubnetMode::Authoritative,
            server_ip: server.parse().expect("ip"),
            pool: vec![],
            routers: vec![],
            dns: vec![],
            ntp: vec![],
            domain: None,
            lease_seconds: 3600,
            relay_agents: vec![],
            unknown_permille: 500,
            leases_per_circuit: 4,
            router_advert: None,
        };
        let relay: Ipv4Addr = "10.0.0.254".parse().expect("ip");
        let mut relayed = s("10.0.1.0/24", "10.0.0.1");
        relayed.relay_agents = vec![relay];
        let subnets = vec![
            s("10.0.0.0/24", "10.0.0.1"),
            relayed,
            s("10.0.9.0/24", "10.0.9.1"),
        ];
        let ip = |v: &str| v.parse::<Ipv4Addr>().expect("ip");
        let z = Ipv4Addr::UNSPECIFIED;
        let local = [ip("10.0.0.1")];
        let key = |r: Result<&Subnet, NoSubnet>| r.map(Subnet::key);
        assert_eq!(
            key(select_subnet(&subnets, ip("10.0.1.1"), z, &local, relay)),
            Ok("10.0.1.0/24".into())
        );
        assert_eq!(
            key(select_subnet(
                &subnets,
                ip("10.0.1.1"),
                z,
                &local,
                ip("10.0.0.77")
            )),
            Err(NoSubnet::UntrustedRelay),
            "a giaddr written by a client on the local segment"
        );
        assert_eq!(
            key(select_subnet(&subnets, z, z, &local, z)),
            Ok("10.0.0.0/24".into())
        );
        // A relay on the segment itself, sending from its giaddr (perfdhcp does): its own subnet.
        assert_eq!(
            key(select_subnet(
                &subnets,
                ip("10.0.0.2"),
                z,
                &local,
                ip("10.0.0.2")
            )),
            Ok("10.0.0.0/24".into())
        );
        assert_eq!(
            key(select_subnet(&subnets, ip("192.168.0.1"), z, &local, relay)),
            Err(NoSubnet::Unknown)
        );
        // Arrived on another interface (a management LAN): nothing.
        assert_eq!(
            key(select_subnet(&subnets, z, z, &[ip("192.168.77.1")], z)),
            Err(NoSubnet::Unknown)
        );
        // ciaddr: a subnet of the arrival interface, or a relayed one, never another LAN's.
        assert_eq!(
            key(select_subnet(
                &subnets,
                z,
                ip("10.0.1.20"),
                &local,
                ip("10.0.1.20")
            )),
            Ok("10.0.1.0/24".into())
        );
        assert_eq!(
            key(select_subnet(
                &subnets,
                z,
                ip("10.0.9.20"),
                &local,
                ip("10.0.9.20")
            )),
            Ok("10.0.0.0/24".into()),
            "10.0.9.0/24 is not on this interface: the interface decides"
        );
    }
}

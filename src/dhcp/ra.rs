//! IPv6 router advertisements on provisioning links (a subnet's `ipv6_ra`, RFC 4861 section 6.2).
//! iPXE configures IPv6 next to its DHCP and, on a link without a router, waits for a router
//! advertisement until it gives up (about 15 s) before it boots. Plinth answers its router
//! solicitation at once with an advertisement that configures nothing: router lifetime 0 (not a
//! default router, RFC 4861 section 6.3.4), managed and other-configuration flags clear (no
//! DHCPv6), no prefix unless the subnet lists some (`ipv6_ra_prefixes`), no MTU or hop limit
//! (0: unspecified).
//!
//! Where: only on interfaces Plinth serves DHCP on (`dhcp.interfaces`, or every interface when
//! that list is empty) that hold an IPv4 address of a subnet with `ipv6_ra = true`; a relayed
//! subnet's link is not Plinth's and gets none. What: a solicited advertisement is unicast to the
//! soliciting host's link-local address (RFC 4861 section 6.2.6 allows it) without the random
//! delay, so iPXE's wait ends at once; a solicitation from the unspecified address is answered
//! by a multicast advertisement, at most one per `MIN_DELAY_BETWEEN_RAS` (3 s); unsolicited
//! multicast advertisements go out at start (three, 16 s apart, section 6.2.4) and then every
//! 200-600 s. Bounded: each link answers at most `ANSWERS_PER_SECOND` solicitations a second
//! (a token bucket), the rest dropped and counted; a packet that is not a valid solicitation
//! (section 6.1.1: hop limit 255, code 0, at least 8 bytes, no link-layer option from `::`) is
//! dropped and counted.
//!
//! Why hand-written: a router advertisement is a 16-byte header and two fixed options; the raw
//! ICMPv6 socket is socket2's, the ancillary data nix's, and the kernel fills the checksum
//! (ICMPv6 raw sockets always do, RFC 3542 section 3.1).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::socket::{
    recvmsg, sendto, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrIn6,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use crate::domain::dhcp::{RouterAdvert, Subnet};
use crate::metrics::Metrics;

/// ICMPv6 type of a router solicitation (RFC 4861 section 4.1).
const ROUTER_SOLICITATION: u8 = 133;
/// ICMPv6 type of a router advertisement (RFC 4861 section 4.2).
const ROUTER_ADVERTISEMENT: u8 = 134;
/// All-nodes (advertisements) and all-routers (solicitations) link-local groups.
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
/// RFC 4861 section 10: router constants.
const MIN_DELAY_BETWEEN_RAS: Duration = Duration::from_secs(3);
const MAX_INITIAL_RTR_ADVERTISEMENTS: u32 = 3;
const MAX_INITIAL_RTR_ADVERT_INTERVAL: Duration = Duration::from_secs(16);
/// Unsolicited advertisements between these (RFC 4861 section 6.2.1's defaults).
const MIN_RTR_ADV_INTERVAL: Duration = Duration::from_secs(200);
const MAX_RTR_ADV_INTERVAL: Duration = Duration::from_secs(600);
/// Solicitations answered per second per link (and the bucket's depth).
const ANSWERS_PER_SECOND: f64 = 50.0;
/// Prefix lifetimes, seconds (RFC 4861 section 6.2.1's defaults: 30 days valid, 7 preferred).
const VALID_LIFETIME: u32 = 2_592_000;
const PREFERRED_LIFETIME: u32 = 604_800;

/// One link Plinth advertises on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaLink {
    /// Interface name.
    pub interface: String,
    /// Interface index.
    pub index: u32,
    /// Its link-layer (MAC) address, for the source link-layer address option.
    pub mac: Option<[u8; 6]>,
    /// What the advertisements say (the prefixes of every subnet with `ipv6_ra` on it).
    pub advert: RouterAdvert,
}

/// The links to advertise on: interfaces DHCP serves (`interfaces`, or all when empty) holding
/// an IPv4 address of a subnet with `ipv6_ra`.
pub fn links(subnets: &[Subnet], interfaces: &[String]) -> Vec<RaLink> {
    let addrs = if_addrs::get_if_addrs().unwrap_or_default();
    let mut out: Vec<RaLink> = Vec::new();
    for a in &addrs {
        let std::net::IpAddr::V4(ip) = a.ip() else {
            continue;
        };
        if ip.is_loopback() || !(interfaces.is_empty() || interfaces.contains(&a.name)) {
            continue;
        }
        let Some(index) = a.index else { continue };
        for s in subnets_of(subnets, ip) {
            let Some(advert) = &s.router_advert else {
                continue;
            };
            let link = match out.iter_mut().find(|l| l.index == index) {
                Some(l) => l,
                None => {
                    out.push(RaLink {
                        interface: a.name.clone(),
                        index,
                        mac: mac_of(&a.name),
                        advert: RouterAdvert::default(),
                    });
                    let Some(l) = out.last_mut() else { continue };
                    l
                }
            };
            for p in &advert.prefixes {
                if !link.advert.prefixes.contains(p) {
                    link.advert.prefixes.push(*p);
                }
            }
        }
    }
    out
}

fn subnets_of(subnets: &[Subnet], ip: Ipv4Addr) -> impl Iterator<Item = &Subnet> {
    subnets.iter().filter(move |s| s.net.contains(&ip))
}

/// An interface's MAC from sysfs (`None` when it has none, e.g. a tunnel).
fn mac_of(interface: &str) -> Option<[u8; 6]> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{interface}/address")).ok()?;
    let mac: crate::domain::MacAddr = text.trim().parse().ok()?;
    Some(mac.octets())
}

/// A router advertisement (RFC 4861 section 4.2) saying `advert`, from a host with `mac`. The
/// checksum is left 0: the kernel fills it.
pub fn advertisement(advert: &RouterAdvert, mac: Option<[u8; 6]>) -> Vec<u8> {
    // Type, code, checksum; cur hop limit 0 (unspecified); M and O clear; router lifetime 0;
    // reachable time 0 and retrans timer 0 (unspecified).
    let mut p = vec![ROUTER_ADVERTISEMENT, 0, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&[0; 8]);
    if let Some(mac) = mac {
        // Source link-layer address option (section 4.6.1): type 1, length 1 (8 bytes).
        p.extend_from_slice(&[1, 1]);
        p.extend_from_slice(&mac);
    }
    for prefix in &advert.prefixes {
        // Prefix information option (section 4.6.2): type 3, length 4 (32 bytes); L and A set.
        p.extend_from_slice(&[3, 4, prefix.prefix_len(), 0xc0]);
        p.extend_from_slice(&VALID_LIFETIME.to_be_bytes());
        p.extend_from_slice(&PREFERRED_LIFETIME.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
        p.extend_from_slice(&prefix.network().octets());
    }
    p
}

/// Why a received ICMPv6 packet is not a solicitation to answer (section 6.1.1), or `None`.
pub fn invalid_solicitation(
    packet: &[u8],
    hop_limit: Option<i32>,
    from: Ipv6Addr,
) -> Option<&'static str> {
    match packet.first() {
        Some(&ROUTER_SOLICITATION) => {}
        _ => return Some("not_a_solicitation"),
    }
    if hop_limit != Some(255) {
        return Some("hop_limit");
    }
    if packet.len() < 8 || packet.get(1) != Some(&0) {
        return Some("malformed");
    }
    // Options: each at least 8 bytes and whole; none from `::` may carry a link-layer address.
    let mut rest = packet.get(8..).unwrap_or(&[]);
    while !rest.is_empty() {
        let (Some(&kind), Some(&blocks)) = (rest.first(), rest.get(1)) else {
            return Some("malformed");
        };
        let len = usize::from(blocks) * 8;
        if len == 0 || len > rest.len() {
            return Some("malformed");
        }
        if kind == 1 && from.is_unspecified() {
            return Some("malformed");
        }
        rest = rest.get(len..).unwrap_or(&[]);
    }
    None
}

/// Label: why a packet got no advertisement.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// hop_limit, malformed, rate_limited...
    pub reason: &'static str,
}

/// Label: solicited (unicast or multicast answer) or unsolicited.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `solicited` or `unsolicited`.
    pub kind: &'static str,
}

/// Router advertisement counters.
#[derive(Clone, Default)]
pub struct RaMetrics {
    sent: Family<KindLabel, Counter>,
    dropped: Family<ReasonLabel, Counter>,
}

impl RaMetrics {
    /// Register with the shared registry.
    pub fn register(metrics: &Metrics) -> Self {
        let m = RaMetrics::default();
        metrics.register(
            "ra_sent",
            "IPv6 router advertisements sent (ipv6_ra), solicited or unsolicited",
            m.sent.clone(),
        );
        metrics.register(
            "ra_dropped",
            "ICMPv6 packets on advertising links that got no router advertisement, by reason",
            m.dropped.clone(),
        );
        m
    }

    fn sent(&self, kind: &'static str) {
        self.sent.get_or_create(&KindLabel { kind }).inc();
    }

    fn drop(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// A raw ICMPv6 socket on one link: joined to all-routers, hop limit 255 on what it sends (RFC
/// 4861 section 6.1.2 has receivers drop anything else), the hop limit of what it receives.
pub fn bind(link: &RaLink) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    s.bind_device(Some(link.interface.as_bytes()))?;
    s.join_multicast_v6(&ALL_ROUTERS, link.index)?;
    s.set_multicast_if_v6(link.index)?;
    s.set_multicast_hops_v6(255)?;
    s.set_unicast_hops_v6(255)?;
    s.set_multicast_loop_v6(false)?;
    setsockopt(&s, sockopt::Ipv6RecvHopLimit, &true).map_err(std::io::Error::from)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Advertise on each of `links` (their sockets bound by `bind`) until `shutdown`.
pub async fn serve(
    links: Vec<(RaLink, socket2::Socket)>,
    metrics: RaMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for (link, socket) in links {
        // Joined to the runtime as tokio's UDP socket type, whose readiness and `async_io` are
        // all that is used (no `recv_from`/`send_to` of its own): tokio's `AsyncFd` would do the
        // same but now needs `unsafe` to register a descriptor.
        let fd = UdpSocket::from_std(std::net::UdpSocket::from(socket))?;
        let (metrics, stop) = (metrics.clone(), shutdown.clone());
        tasks.spawn(async move { advertise(link, Arc::new(fd), metrics, stop).await });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// A token bucket of solicitations answered.
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.duration_since(self.at).as_secs_f64() * ANSWERS_PER_SECOND;
        self.tokens = (self.tokens + refill).min(ANSWERS_PER_SECOND);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A pseudo-random duration in `[low, high]` (the spread RFC 4861 asks for between unsolicited
/// advertisements, so that routers do not synchronise; not a secret).
fn between(low: Duration, high: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let span = high.saturating_sub(low).as_millis() as u64;
    low + Duration::from_millis(u64::from(nanos) % span.max(1))
}

async fn advertise(link: RaLink, fd: Arc<UdpSocket>, metrics: RaMetrics, stop: CancellationToken) {
    let packet = advertisement(&link.advert, link.mac);
    let send = |to: Ipv6Addr| {
        let dest = SockaddrIn6::from(SocketAddrV6::new(to, 0, 0, link.index));
        let (fd, packet) = (fd.clone(), &packet);
        async move {
            let raw = fd.as_raw_fd();
            fd.async_io(Interest::WRITABLE, || {
                sendto(raw, packet, &dest, MsgFlags::empty()).map_err(std::io::Error::from)
            })
            .await
            .map(|_| ())
        }
    };
    let mut buckets = Bucket {
        tokens: ANSWERS_PER_SECOND,
        at: Instant::now(),
    };
    let mut last_multicast: Option<Instant> = None;
    let mut multicast_owed = false;
    let mut initial = 0u32;
    let mut next_unsolicited = tokio::time::Instant::now();
    let mut buf = vec![0u8; 1500];
    tracing::info!(interface = %link.interface, prefixes = link.advert.prefixes.len(), "sending IPv6 router advertisements (router lifetime 0)");
    loop {
        // A multicast answer owed to a solicitation from `::` goes out once 3 s have passed
        // since the last multicast advertisement.
        let owed_at = match (multicast_owed, last_multicast) {
            (true, Some(t)) => tokio::time::Instant::from_std(t + MIN_DELAY_BETWEEN_RAS),
            (true, None) => tokio::time::Instant::now(),
            (false, _) => next_unsolicited,
        };
        let wake = owed_at.min(next_unsolicited);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(wake) => {
                let kind = if multicast_owed { "solicited" } else { "unsolicited" };
                match send(ALL_NODES).await {
                    Ok(()) => metrics.sent(kind),
                    Err(e) => {
                        metrics.drop("send_failed");
                        tracing::debug!(error = %e, interface = %link.interface, "router advertisement not sent");
                    }
                }
                last_multicast = Some(Instant::now());
                multicast_owed = false;
                if tokio::time::Instant::now() >= next_unsolicited {
                    initial += 1;
                    next_unsolicited = tokio::time::Instant::now() + if initial < MAX_INITIAL_RTR_ADVERTISEMENTS {
                        MAX_INITIAL_RTR_ADVERT_INTERVAL
                    } else {
                        between(MIN_RTR_ADV_INTERVAL, MAX_RTR_ADV_INTERVAL)
                    };
                }
            }
            got = fd.async_io(Interest::READABLE, || {
                    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
                    let mut space = nix::cmsg_space!(nix::libc::c_int);
                    let msg = recvmsg::<SockaddrIn6>(fd.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::empty())
                        .map_err(std::io::Error::from)?;
                    let mut hops = None;
                    if let Ok(cmsgs) = msg.cmsgs() {
                        for c in cmsgs {
                            if let ControlMessageOwned::Ipv6HopLimit(h) = c {
                                hops = Some(h);
                            }
                        }
                    }
                    Ok((msg.bytes, msg.address.map(|a| a.ip()), hops))
                }) => {
                let (n, from, hops) = match got {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::debug!(error = %e, "icmpv6 receive failed");
                        continue;
                    }
                };
                let Some(from) = from else { continue };
                let received = buf.get(..n).unwrap_or(&[]);
                match invalid_solicitation(received, hops, from) {
                    // Neighbour discovery and echo traffic share the socket: not counted.
                    Some("not_a_solicitation") => continue,
                    Some(reason) => {
                        metrics.drop(reason);
                        continue;
                    }
                    None => {}
                }
                if !buckets.take(Instant::now()) {
                    metrics.drop("rate_limited");
                    continue;
                }
                if from.is_unspecified() {
                    multicast_owed = true;
                    continue;
                }
                match send(from).await {
                    Ok(()) => metrics.sent("solicited"),
                    Err(e) => {
                        metrics.drop("send_failed");
                        tracing::debug!(error = %e, %from, "router advertisement not sent");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advertisement_configures_nothing_unless_given_prefixes() {
        let mac = [0x52, 0x54, 0, 1, 2, 3];
        let p = advertisement(&RouterAdvert::default(), Some(mac));
        assert_eq!(p.len(), 24);
        assert_eq!(p[0], 134);
        assert_eq!(p[5], 0, "M and O clear");
        assert_eq!(&p[6..8], &[0, 0], "router lifetime 0");
        assert_eq!(&p[16..18], &[1, 1]);
        assert_eq!(&p[18..24], &mac);
        let with = advertisement(
            &RouterAdvert {
                prefixes: vec!["fd00:10::/64".parse().expect("prefix")],
            },
            None,
        );
        assert_eq!(with.len(), 16 + 32);
        assert_eq!(&with[16..20], &[3, 4, 64, 0xc0]);
        assert_eq!(
            &with[32..48],
            &"fd00:10::".parse::<Ipv6Addr>().expect("ip").octets()
        );
    }

    #[test]
    fn only_valid_solicitations_are_answered() {
        let ll: Ipv6Addr = "fe80::1".parse().expect("ip");
        let rs = [133u8, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 3, 4, 5, 6];
        assert_eq!(invalid_solicitation(&rs, Some(255), ll), None);
        assert_eq!(invalid_solicitation(&rs, Some(64), ll), Some("hop_limit"));
        assert_eq!(invalid_solicitation(&rs, None, ll), Some("hop_limit"));
        assert_eq!(
            invalid_solicitation(&rs, Some(255), Ipv6Addr::UNSPECIFIED),
            Some("malformed"),
            "no link-layer option from ::"
        );
        assert_eq!(
            invalid_solicitation(&rs[..8], Some(255), Ipv6Addr::UNSPECIFIED),
            None
        );
        assert_eq!(
            invalid_solicitation(&rs[..6], Some(255), ll),
            Some("malformed")
        );
        assert_eq!(
            invalid_solicitation(&[133, 0, 0, 0, 0, 0, 0, 0, 1, 0], Some(255), ll),
            Some("malformed"),
            "zero-length option"
        );
        assert_eq!(
            invalid_solicitation(&[135, 0, 0, 0], Some(255), ll),
            Some("not_a_solicitation")
        );
        assert_eq!(
            invalid_solicitation(&[], Some(255), ll),
            Some("not_a_solicitation")
        );
    }
}

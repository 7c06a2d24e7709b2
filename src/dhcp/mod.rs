//! The DHCP front door: receives on UDP 67 (and the proxyDHCP port 4011), decodes, asks the
//! provisioning service (`ProvisioningService::dhcp`), encodes, and sends the answer where RFC 2131 section 4.1 says: to the relay, to
//! the client's address, or broadcast on the interface the request came in on. Malformed packets,
//! floods and overload are dropped and counted, never a panic.
//!
//! `app` runs it on a runtime and OS thread of its own: during a boot storm the main runtime is
//! busy streaming images to hundreds of machines, and a DISCOVER queued behind that work misses
//! the firmware's retransmission timer.
//!
//! Imports `service` and `domain` only; no other front door, no store.

pub mod wire;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::domain::MacAddr;
use crate::metrics::Metrics;
use crate::service::provisioning::dhcp::{Outcome, ReplyKind};
use crate::service::provisioning::ProvisioningService;

/// Client port (RFC 2131 section 4.1).
pub const CLIENT_PORT: u16 = 68;

/// A bound DHCP socket and what it serves.
pub struct DhcpSocket {
    /// The socket (SO_BROADCAST set, nonblocking; bound to one interface where configured). A std
    /// socket: it joins the runtime that serves it (`serve`) only there.
    pub socket: std::net::UdpSocket,
    /// Interface name, when bound to one.
    pub interface: Option<String>,
    /// IPv4 addresses of that interface: they select the subnet of unrelayed requests.
    pub local_ips: Vec<Ipv4Addr>,
    /// The proxyDHCP port (4011).
    pub proxy: bool,
}

/// Label: a message type.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// discover, request, offer, ack, nak...
    pub kind: String,
}

/// Label: why a packet was dropped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// truncated, malformed, rate_limited...
    pub reason: String,
}

/// DHCP counters.
#[derive(Clone, Default)]
pub struct DhcpMetrics {
    received: Family<KindLabel, Counter>,
    replies: Family<KindLabel, Counter>,
    dropped: Family<ReasonLabel, Counter>,
}

impl DhcpMetrics {
    /// Register with the shared registry.
    pub fn register(metrics: &Metrics) -> Self {
        let m = Self::default();
        metrics.register(
            "dhcp_received",
            "DHCP requests received, by message type",
            m.received.clone(),
        );
        metrics.register(
            "dhcp_replies",
            "DHCP answers sent, by message type",
            m.replies.clone(),
        );
        metrics.register(
            "dhcp_dropped",
            "DHCP packets dropped or left unanswered, by reason",
            m.dropped.clone(),
        );
        m
    }

    fn drop(&self, reason: &str) {
        self.dropped
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }
}

/// Per-MAC token bucket: a client that floods is dropped, others are not.
struct FloodGuard {
    buckets: Mutex<HashMap<MacAddr, (f64, Instant)>>,
    rate: f64,
    burst: f64,
}

impl FloodGuard {
    fn allow(&self, mac: MacAddr) -> bool {
        let Ok(mut b) = self.buckets.lock() else {
            return true;
        };
        if b.len() > 100_000 {
            let now = Instant::now();
            b.retain(|_, (_, t)| now.duration_since(*t).as_secs() < 60);
        }
        let now = Instant::now();
        let (tokens, last) = b.entry(mac).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * self.rate).min(self.burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Most requests decided at once; beyond it packets are dropped (counted as `overload`). A
/// thousand machines powered on together send a thousand DISCOVERs within milliseconds: they wait
/// here for the database rather than being dropped into the firmware's 4-second retry.
const MAX_IN_FLIGHT: usize = 4096;

/// Receive buffer asked for on each DHCP socket (the kernel's default, about 200 KiB, holds fewer
/// than a hundred DHCP packets).
const RECV_BUFFER: usize = 4 << 20;

/// A socket joined to the serving runtime.
struct Serving {
    socket: UdpSocket,
    interface: Option<String>,
    local_ips: Vec<Ipv4Addr>,
    proxy: bool,
}

/// Serve on `sockets` until `shutdown`.
pub async fn serve(
    sockets: Vec<DhcpSocket>,
    service: ProvisioningService,
    metrics: DhcpMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let guard = Arc::new(FloodGuard {
        buckets: Mutex::new(HashMap::new()),
        rate: 20.0,
        burst: 40.0,
    });
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut loops = tokio::task::JoinSet::new();
    for s in sockets {
        let sock = Arc::new(Serving {
            socket: UdpSocket::from_std(s.socket)?,
            interface: s.interface,
            local_ips: s.local_ips,
            proxy: s.proxy,
        });
        let (service, metrics, guard, limit, stop) = (
            service.clone(),
            metrics.clone(),
            guard.clone(),
            limit.clone(),
            shutdown.clone(),
        );
        loops.spawn(async move {
            let mut buf = vec![0u8; 1500];
            loop {
                let (n, from) = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = sock.socket.recv_from(&mut buf) => match r {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::warn!(error = %e, "dhcp receive failed");
                            continue;
                        }
                    },
                };
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    metrics.drop("overload");
                    continue;
                };
                let packet = buf[..n].to_vec();
                let (sock, service, metrics, guard) = (
                    sock.clone(),
                    service.clone(),
                    metrics.clone(),
                    guard.clone(),
                );
                tokio::spawn(async move {
                    handle(&sock, &service, &metrics, &guard, &packet, from).await;
                    drop(permit);
                });
            }
        });
    }
    while loops.join_next().await.is_some() {}
    Ok(())
}

async fn handle(
    sock: &Serving,
    service: &ProvisioningService,
    metrics: &DhcpMetrics,
    guard: &FloodGuard,
    packet: &[u8],
    from: SocketAddr,
) {
    let (msg, mut req) = match wire::decode(packet, sock.proxy, &sock.local_ips) {
        Ok(x) => x,
        Err(reason) => {
            metrics.drop(reason);
            tracing::debug!(%from, reason, "dhcp packet dropped");
            return;
        }
    };
    metrics
        .received
        .get_or_create(&KindLabel {
            kind: format!("{:?}", req.kind).to_lowercase(),
        })
        .inc();
    if !guard.allow(req.mac) {
        metrics.drop("rate_limited");
        return;
    }
    req.interface.clone_from(&sock.interface);
    let outcome = match service.dhcp(&req).await {
        Ok(o) => o,
        Err(e) => {
            // A store fault: no answer (the client retries), never a wrong one.
            tracing::error!(error = %e, mac = %req.mac, "dhcp decision failed");
            metrics.drop("store_error");
            return;
        }
    };
    let reply = match outcome {
        Outcome::Reply(r) => r,
        Outcome::Silent(reason) => {
            metrics.drop(reason);
            tracing::debug!(mac = %req.mac, kind = ?req.kind, reason, "dhcp: no answer");
            return;
        }
    };
    let Some(bytes) = wire::encode(&msg, &reply) else {
        metrics.drop("encode_failed");
        return;
    };
    // RFC 2131 section 4.1: relay, then NAK broadcast, then ciaddr, then broadcast.
    let to = if sock.proxy {
        from
    } else if !req.giaddr.is_unspecified() {
        SocketAddr::V4(SocketAddrV4::new(req.giaddr, 67))
    } else if reply.kind != ReplyKind::Nak && !req.ciaddr.is_unspecified() {
        SocketAddr::V4(SocketAddrV4::new(req.ciaddr, CLIENT_PORT))
    } else {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT))
    };
    match sock.socket.send_to(&bytes, to).await {
        Ok(_) => {
            let kind = format!("{:?}", reply.kind).to_lowercase();
            metrics
                .replies
                .get_or_create(&KindLabel { kind: kind.clone() })
                .inc();
            tracing::info!(
                mac = %req.mac, kind = %kind, yiaddr = %reply.yiaddr, client = %req.client,
                boot_file = reply.boot.as_ref().map(|b| b.file.as_str()).unwrap_or(""),
                interface = sock.interface.as_deref().unwrap_or("*"), to = %to, "dhcp answer"
            );
        }
        Err(e) => {
            metrics.drop("send_failed");
            tracing::warn!(error = %e, %to, "dhcp send failed");
        }
    }
}

/// Bind a DHCP socket on `port`, on one interface (`SO_BINDTODEVICE`) or all of them.
pub fn bind(port: u16, interface: Option<&str>, proxy: bool) -> std::io::Result<DhcpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.set_broadcast(true)?;
    if let Some(ifname) = interface {
        s.bind_device(Some(ifname.as_bytes()))?;
    }
    s.set_nonblocking(true)?;
    // Past net.core.rmem_max where the process may (CAP_NET_ADMIN), else up to it.
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(&s, RECV_BUFFER).is_err() {
        let _ = s.set_recv_buffer_size(RECV_BUFFER);
    }
    s.bind(&SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)).into())?;
    let local_ips = local_ipv4s(interface);
    let socket: std::net::UdpSocket = s.into();
    Ok(DhcpSocket {
        socket,
        interface: interface.map(str::to_string),
        local_ips,
        proxy,
    })
}

/// IPv4 addresses of an interface (all interfaces when `None`).
pub fn local_ipv4s(interface: Option<&str>) -> Vec<Ipv4Addr> {
    if_addrs::get_if_addrs()
        .unwrap_or_default()
        .into_iter()
        .filter(|i| interface.is_none_or(|n| i.name == n))
        .filter_map(|i| match i.ip() {
            std::net::IpAddr::V4(v4) if !v4.is_loopback() => Some(v4),
            _ => None,
        })
        .collect()
}

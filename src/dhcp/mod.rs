//! The DHCP front door: receives on UDP 67 (and the proxyDHCP port 4011), decodes, passes the
//! request through the flood guard (`admission`), asks the provisioning service
//! (`ProvisioningService::dhcp`), encodes, and sends the answer where RFC 2131 section 4.1 says: to
//! the relay, to the client's address, or broadcast, out of the interface the request came in on
//! (`socket`). Malformed packets, floods and overload are dropped and counted, never a panic.
//!
//! `app` runs it on a runtime and OS thread of its own: during a boot storm the main runtime is
//! busy streaming images to hundreds of machines, and a DISCOVER queued behind that work misses
//! the firmware's retransmission timer.
//!
//! Imports `service` and `domain` only; no other front door, no store.

pub mod admission;
pub mod ra;
mod socket;
pub mod wire;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use socket::{bind, local_ipv4s, DhcpSocket};

pub use admission::Rates;

use admission::{Admission, Source, Verdict};
use socket::{Arrival, Serving};

use crate::metrics::{AtomicHistogram, Metrics};
use crate::service::provisioning::dhcp::{DhcpRequest, Outcome, ReplyKind, RequestKind};
use crate::service::provisioning::ProvisioningService;

/// Client port (RFC 2131 section 4.1).
pub const CLIENT_PORT: u16 = 68;

/// Label: a message type.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// discover, request, offer, ack, nak...
    pub kind: &'static str,
}

/// Label: why a packet was dropped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// truncated, malformed, rate_limited...
    pub reason: &'static str,
}

/// Label: how far a request got, timed from its arrival.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    /// `decided` (the service answered), `committed` (its lease was durable), `sent`.
    pub stage: &'static str,
}

/// Label: requests of clients the inventory knows, or not (their in-flight limits differ).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    /// `known` or `unknown`.
    pub class: &'static str,
}

/// DHCP metrics. Everything the packet path touches is an atomic (counters, gauges,
/// [`AtomicHistogram`]); label values are static strings from closed sets, so no packet
/// allocates a series or waits on a lock to be counted.
#[derive(Clone)]
pub struct DhcpMetrics {
    received: Family<KindLabel, Counter>,
    replies: Family<KindLabel, Counter>,
    dropped: Family<ReasonLabel, Counter>,
    decided: AtomicHistogram,
    committed: AtomicHistogram,
    sent: AtomicHistogram,
    in_flight_known: Gauge,
    in_flight_unknown: Gauge,
}

impl DhcpMetrics {
    /// Register with the shared registry.
    pub fn register(metrics: &Metrics) -> Self {
        let stages =
            Family::<StageLabel, AtomicHistogram, fn() -> AtomicHistogram>::new_with_constructor(
                AtomicHistogram::seconds,
            );
        let stage = |name| stages.get_or_create(&StageLabel { stage: name }).clone();
        let in_flight = Family::<ClassLabel, Gauge>::default();
        let class = |name| in_flight.get_or_create(&ClassLabel { class: name }).clone();
        let m = Self {
            received: Family::default(),
            replies: Family::default(),
            dropped: Family::default(),
            decided: stage("decided"),
            committed: stage("committed"),
            sent: stage("sent"),
            in_flight_known: class("known"),
            in_flight_unknown: class("unknown"),
        };
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
            "DHCP packets dropped or left unanswered, by reason (socket_overflow: dropped by the \
             kernel before Plinth could read them, its receive queue full)",
            m.dropped.clone(),
        );
        metrics.register(
            "dhcp_latency_seconds",
            "Time from a DHCP request's arrival until the service decided it (decided), its lease \
             was committed (committed: ACKs, and offers on a shared database), its answer was sent \
             (sent)",
            stages,
        );
        metrics.register(
            "dhcp_in_flight",
            "DHCP requests being decided now, by client class (bounded: beyond the limit they are \
             dropped as overload)",
            in_flight,
        );
        m
    }

    fn drop(&self, reason: &'static str) {
        self.drop_n(reason, 1);
    }

    fn drop_n(&self, reason: &'static str, n: u64) {
        self.dropped
            .get_or_create(&ReasonLabel { reason })
            .inc_by(n);
    }
}

/// Metric label of a request kind.
fn request_label(kind: RequestKind) -> &'static str {
    match kind {
        RequestKind::Discover => "discover",
        RequestKind::Request => "request",
        RequestKind::Decline => "decline",
        RequestKind::Release => "release",
        RequestKind::Inform => "inform",
    }
}

/// Metric label of a reply kind.
fn reply_label(kind: ReplyKind) -> &'static str {
    match kind {
        ReplyKind::Offer => "offer",
        ReplyKind::Ack => "ack",
        ReplyKind::Nak => "nak",
    }
}

/// How long a request may take to be decided. A firmware retransmits after about 4 s (RFC 2131
/// section 4.1) and takes no answer to the old one after that: a decision stuck behind a stalled
/// database is given up and counted (`decision_timeout`), its in-flight place freed.
const DECISION_TIMEOUT: Duration = Duration::from_secs(4);

/// Most requests decided at once; beyond it packets are dropped (counted as `overload`). A
/// thousand machines powered on together send a thousand DISCOVERs within milliseconds: they wait
/// here for the database rather than being dropped into the firmware's 4-second retry.
const MAX_IN_FLIGHT: usize = 4096;
/// Of those, kept for clients the inventory knows: a flood of made-up MACs fills only the rest,
/// and a known machine's request is still decided.
const KNOWN_IN_FLIGHT: usize = 1024;

/// How many requests are being decided, for known and for unknown clients.
struct InFlight {
    known: Arc<Semaphore>,
    unknown: Arc<Semaphore>,
}

/// Serve on `sockets` until `shutdown`, admitting requests at `rates` (see `admission`).
pub async fn serve(
    sockets: Vec<DhcpSocket>,
    service: ProvisioningService,
    metrics: DhcpMetrics,
    rates: Rates,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let guard = Arc::new(Admission::new(rates));
    let limit = Arc::new(InFlight {
        known: Arc::new(Semaphore::new(KNOWN_IN_FLIGHT)),
        unknown: Arc::new(Semaphore::new(MAX_IN_FLIGHT - KNOWN_IN_FLIGHT)),
    });
    let mut loops = tokio::task::JoinSet::new();
    {
        let (service, stop) = (service.clone(), shutdown.clone());
        loops.spawn(async move {
            service.refresh_known_macs(KNOWN_REFRESH, stop).await;
        });
    }
    for s in sockets {
        let sock = Arc::new(Serving::new(s)?);
        let (service, metrics, guard, limit, stop) = (
            service.clone(),
            metrics.clone(),
            guard.clone(),
            limit.clone(),
            shutdown.clone(),
        );
        loops.spawn(async move {
            let mut buf = vec![0u8; 1500];
            let mut overflowed = 0u32;
            loop {
                let got = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = sock.recv(&mut buf) => match r {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::warn!(error = %e, "dhcp receive failed");
                            continue;
                        }
                    },
                };
                let received = Instant::now();
                if let Some(total) = got.overflowed {
                    let lost = total.wrapping_sub(overflowed);
                    if lost > 0 && lost < u32::MAX / 2 {
                        metrics.drop_n("socket_overflow", u64::from(lost));
                    }
                    overflowed = total;
                }
                let (n, arrival) = (got.len, got.arrival);
                let Some(arrival) = arrival else {
                    metrics.drop("unknown_interface");
                    continue;
                };
                // Decode and admit here, before any task or allocation per packet.
                let Some((msg, req)) =
                    admit(&sock, &service, &metrics, &guard, &buf[..n], &arrival)
                else {
                    continue;
                };
                let (room, gauge) = if req.known {
                    (&limit.known, metrics.in_flight_known.clone())
                } else {
                    (&limit.unknown, metrics.in_flight_unknown.clone())
                };
                let Ok(permit) = room.clone().try_acquire_owned() else {
                    metrics.drop("overload");
                    continue;
                };
                gauge.inc();
                let (sock, service, metrics) = (sock.clone(), service.clone(), metrics.clone());
                tokio::spawn(async move {
                    let decided = tokio::time::timeout(
                        DECISION_TIMEOUT,
                        handle(&sock, &service, &metrics, msg, req, &arrival, received),
                    )
                    .await;
                    if decided.is_err() {
                        metrics.drop("decision_timeout");
                    }
                    gauge.dec();
                    drop(permit);
                });
            }
        });
    }
    while loops.join_next().await.is_some() {}
    Ok(())
}

/// How often the inventory's MACs are read again for the flood guard.
const KNOWN_REFRESH: std::time::Duration = std::time::Duration::from_secs(30);

/// Decode a datagram and pass it through the flood guard: the request to decide, or `None`
/// (dropped and counted).
fn admit(
    sock: &Serving,
    service: &ProvisioningService,
    metrics: &DhcpMetrics,
    guard: &Admission,
    packet: &[u8],
    arrival: &Arrival,
) -> Option<(dhcproto::v4::Message, DhcpRequest)> {
    let (msg, mut req) = match wire::decode(packet, sock.proxy, &arrival.local_ips) {
        Ok(x) => x,
        Err(reason) => {
            metrics.drop(reason);
            tracing::debug!(from = %arrival.from, reason, "dhcp packet dropped");
            return None;
        }
    };
    req.interface.clone_from(&arrival.interface);
    req.source = match arrival.from {
        SocketAddr::V4(a) => *a.ip(),
        SocketAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    };
    req.known = service.is_known(req.mac);
    metrics
        .received
        .get_or_create(&KindLabel {
            kind: request_label(req.kind),
        })
        .inc();
    let source = if req.giaddr.is_unspecified() {
        Source::Interface(arrival.ifindex.unwrap_or(0))
    } else {
        Source::Relay(req.giaddr)
    };
    match guard.admit(req.mac, source, req.known) {
        Verdict::Admit => Some((msg, req)),
        refused => {
            metrics.drop(refused.reason());
            None
        }
    }
}

async fn handle(
    sock: &Serving,
    service: &ProvisioningService,
    metrics: &DhcpMetrics,
    msg: dhcproto::v4::Message,
    req: DhcpRequest,
    arrival: &Arrival,
    received: Instant,
) {
    let outcome = service.dhcp(&req).await;
    metrics.decided.observe_duration(received.elapsed());
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            // A store fault: no answer (the client retries), never a wrong one.
            tracing::error!(error = %e, mac = %req.mac, "dhcp decision failed");
            metrics.drop("store_error");
            return;
        }
    };
    let reply = match outcome {
        Outcome::Reply(r) => {
            if let Some(at) = r.committed {
                metrics
                    .committed
                    .observe_duration(at.saturating_duration_since(received));
            }
            r
        }
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
        arrival.from
    } else if !req.giaddr.is_unspecified() {
        SocketAddr::V4(SocketAddrV4::new(req.giaddr, 67))
    } else if reply.kind != ReplyKind::Nak && !req.ciaddr.is_unspecified() {
        SocketAddr::V4(SocketAddrV4::new(req.ciaddr, CLIENT_PORT))
    } else {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT))
    };
    match sock.send(&bytes, to, arrival).await {
        Ok(_) => {
            metrics.sent.observe_duration(received.elapsed());
            let kind = reply_label(reply.kind);
            metrics.replies.get_or_create(&KindLabel { kind }).inc();
            tracing::info!(
                mac = %req.mac, kind = %kind, yiaddr = %reply.yiaddr, client = %req.client,
                boot_file = reply.boot.as_ref().map(|b| b.file.as_str()).unwrap_or(""),
                interface = arrival.interface.as_deref().unwrap_or("*"), to = %to, "dhcp answer"
            );
        }
        Err(e) => {
            metrics.drop("send_failed");
            tracing::warn!(error = %e, %to, "dhcp send failed");
        }
    }
}

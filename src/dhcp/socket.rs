//! DHCP sockets and where a packet came from. A socket is bound to one interface
//! (`SO_BINDTODEVICE`, `dhcp.interfaces`) or, when no interface is configured, to all of them;
//! then every datagram carries its arrival interface (`IP_PKTINFO`, ip(7)), the request is decided
//! with that interface's addresses only (a DISCOVER on a management LAN never gets a provisioning
//! address), and the answer leaves through the same interface (a broadcast never follows the
//! default route to another LAN).

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
    SockaddrIn,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Receive buffer asked for on each DHCP socket (the kernel's default, about 200 KiB, holds fewer
/// than a hundred DHCP packets).
const RECV_BUFFER: usize = 4 << 20;

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

/// Bind a DHCP socket on `port`, on one interface (`SO_BINDTODEVICE`) or all of them (then with
/// `IP_PKTINFO`, so each datagram says where it arrived).
pub fn bind(port: u16, interface: Option<&str>, proxy: bool) -> std::io::Result<DhcpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.set_broadcast(true)?;
    match interface {
        Some(ifname) => s.bind_device(Some(ifname.as_bytes()))?,
        None => setsockopt(&s, sockopt::Ipv4PacketInfo, &true).map_err(std::io::Error::from)?,
    }
    // Every datagram then carries how many the kernel dropped on this socket so far because its
    // receive queue was full (socket(7) SO_RXQ_OVFL): counted as `socket_overflow`.
    setsockopt(&s, sockopt::RxqOvfl, &1).map_err(std::io::Error::from)?;
    s.set_nonblocking(true)?;
    // Past net.core.rmem_max where the process may (CAP_NET_ADMIN), else up to it.
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(&s, RECV_BUFFER).is_err() {
        let _ = s.set_recv_buffer_size(RECV_BUFFER);
    }
    s.bind(&SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)).into())?;
    let local_ips = match interface {
        Some(_) => local_ipv4s(interface),
        None => Vec::new(),
    };
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

/// One received datagram: its length, where it arrived (`None`: cannot be told, not answered),
/// and the kernel's count of datagrams dropped on the socket so far (SO_RXQ_OVFL).
pub struct Received {
    /// Bytes.
    pub len: usize,
    /// Where it arrived.
    pub arrival: Option<Arrival>,
    /// Datagrams the kernel dropped on this socket since it was opened (queue full).
    pub overflowed: Option<u32>,
}

/// Where a datagram arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// The sender.
    pub from: SocketAddr,
    /// Interface index (only known on an all-interfaces socket).
    pub ifindex: Option<u32>,
    /// Interface name.
    pub interface: Option<String>,
    /// Addresses of the arrival interface.
    pub local_ips: Vec<Ipv4Addr>,
}

/// Interface index -> name and IPv4 addresses, read from the system and refreshed when an index
/// is not known (at most once a second, so a flood cannot turn into a flood of netlink dumps).
#[derive(Default)]
struct Interfaces {
    by_index: HashMap<u32, (String, Vec<Ipv4Addr>)>,
    read_at: Option<Instant>,
}

impl Interfaces {
    fn lookup(&mut self, index: u32) -> Option<(String, Vec<Ipv4Addr>)> {
        let stale = self
            .read_at
            .is_none_or(|t| t.elapsed() > Duration::from_secs(30));
        let may_read = self
            .read_at
            .is_none_or(|t| t.elapsed() > Duration::from_secs(1));
        if (stale || !self.by_index.contains_key(&index)) && may_read {
            self.read();
        }
        self.by_index.get(&index).cloned()
    }

    fn read(&mut self) {
        let mut by_index: HashMap<u32, (String, Vec<Ipv4Addr>)> = HashMap::new();
        for i in if_addrs::get_if_addrs().unwrap_or_default() {
            let Some(index) = i.index else { continue };
            let entry = by_index
                .entry(index)
                .or_insert_with(|| (i.name.clone(), Vec::new()));
            if let std::net::IpAddr::V4(v4) = i.ip() {
                if !v4.is_loopback() {
                    entry.1.push(v4);
                }
            }
        }
        self.by_index = by_index;
        self.read_at = Some(Instant::now());
    }
}

/// A socket joined to the serving runtime.
pub struct Serving {
    socket: UdpSocket,
    /// Interface name, when bound to one.
    pub interface: Option<String>,
    local_ips: Vec<Ipv4Addr>,
    /// Serves the proxyDHCP port.
    pub proxy: bool,
    /// An all-interfaces socket with `IP_PKTINFO`.
    pktinfo: bool,
    interfaces: Mutex<Interfaces>,
}

impl Serving {
    /// Join `s` to the current runtime.
    pub fn new(s: DhcpSocket) -> std::io::Result<Serving> {
        let pktinfo = s.interface.is_none();
        Ok(Serving {
            socket: UdpSocket::from_std(s.socket)?,
            interface: s.interface,
            local_ips: s.local_ips,
            proxy: s.proxy,
            pktinfo,
            interfaces: Mutex::default(),
        })
    }

    /// Receive one datagram into `buf`. Its arrival is `None` when it cannot be told (no
    /// `IP_PKTINFO`, an unknown interface): it is not answered.
    pub async fn recv(&self, buf: &mut [u8]) -> std::io::Result<Received> {
        let fd = self.socket.as_raw_fd();
        let (len, from, ifindex, overflowed) = self
            .socket
            .async_io(Interest::READABLE, || {
                let mut iov = [IoSliceMut::new(buf)];
                let mut space = nix::cmsg_space!(nix::libc::in_pktinfo, u32);
                let msg = recvmsg::<SockaddrIn>(fd, &mut iov, Some(&mut space), MsgFlags::empty())
                    .map_err(std::io::Error::from)?;
                let (mut ifindex, mut overflowed) = (None, None);
                if let Ok(cmsgs) = msg.cmsgs() {
                    for c in cmsgs {
                        match c {
                            ControlMessageOwned::Ipv4PacketInfo(info) => {
                                ifindex = u32::try_from(info.ipi_ifindex).ok();
                            }
                            ControlMessageOwned::RxqOvfl(n) => overflowed = Some(n),
                            _ => {}
                        }
                    }
                }
                let from = msg
                    .address
                    .map(|a| SocketAddr::V4(SocketAddrV4::new(a.ip(), a.port())));
                Ok((msg.bytes, from, ifindex, overflowed))
            })
            .await?;
        let arrival = match (from, self.pktinfo, ifindex) {
            (None, _, _) | (Some(_), true, None) => None,
            (Some(from), false, _) => Some(Arrival {
                from,
                ifindex: None,
                interface: self.interface.clone(),
                local_ips: self.local_ips.clone(),
            }),
            (Some(from), true, Some(index)) => self
                .interfaces
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .lookup(index)
                .map(|(name, local_ips)| Arrival {
                    from,
                    ifindex: Some(index),
                    interface: Some(name),
                    local_ips,
                }),
        };
        Ok(Received {
            len,
            arrival,
            overflowed,
        })
    }

    /// Send `bytes` to `to`, out of the interface the request arrived on.
    pub async fn send(
        &self,
        bytes: &[u8],
        to: SocketAddr,
        arrival: &Arrival,
    ) -> std::io::Result<usize> {
        let (Some(index), SocketAddr::V4(dest)) = (arrival.ifindex, to) else {
            return self.socket.send_to(bytes, to).await;
        };
        let fd = self.socket.as_raw_fd();
        let info = nix::libc::in_pktinfo {
            ipi_ifindex: i32::try_from(index).unwrap_or(0),
            ipi_spec_dst: nix::libc::in_addr {
                s_addr: u32::from(
                    arrival
                        .local_ips
                        .first()
                        .copied()
                        .unwrap_or(Ipv4Addr::UNSPECIFIED),
                )
                .to_be(),
            },
            ipi_addr: nix::libc::in_addr { s_addr: 0 },
        };
        let dest = SockaddrIn::from(dest);
        self.socket
            .async_io(Interest::WRITABLE, || {
                sendmsg(
                    fd,
                    &[IoSlice::new(bytes)],
                    &[ControlMessage::Ipv4PacketInfo(&info)],
                    MsgFlags::empty(),
                    Some(&dest),
                )
                .map_err(std::io::Error::from)
            })
            .await
    }
}

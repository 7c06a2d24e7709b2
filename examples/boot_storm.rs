//! Boot storm: plays N machines at once against a running Plinth, each doing what real firmware and
//! Talos do, over real sockets: DHCP DORA with PXE options (RFC 4578), TFTP of the iPXE binary the
//! OFFER names (RFC 1350 with blksize and tsize, RFC 2347-2349), iPXE's own DHCP round (option 77
//! `iPXE`), `/boot.ipxe` and the per-machine script it chains to, the kernel and initramfs the
//! script names, and the `talos.config=` fetch with the token of that script. Everything after the
//! lease comes from the machine's leased address (the client namespace routes the whole pool to
//! `lo`, so any pool address can be bound). One tokio task per machine; every stage has a timeout
//! and a bounded number of retries, counted; a machine that runs out of retries is an error.
//!
//! `bench/boot_storm.sh` sets up the namespaces, Plinth and the inventory, and runs this; the
//! fleet's identities (MAC, SMBIOS UUID, serial, firmware) come from `inventory`, so the Machine
//! documents Plinth knows and the machines that boot are the same by construction.
//!
//! Uses the library for nothing: it talks to Plinth only through the wire.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::{Parser, Subcommand};
use dhcproto::v4::{self, DhcpOption, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use serde::Serialize;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, Semaphore};

#[derive(Parser)]
#[command(about = "Boot storm simulator for Plinth (see bench/boot_storm.sh)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write the Machine documents of the simulated fleet (one file per machine) into DIR.
    Inventory {
        /// Number of machines.
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// Directory for the Machine documents.
        #[arg(long)]
        dir: PathBuf,
        /// Cluster the machines belong to.
        #[arg(long, default_value = "storm")]
        cluster: String,
        /// Profile of the machines.
        #[arg(long, default_value = "storm")]
        profile: String,
    },
    /// Boot the fleet against a running Plinth.
    Run(RunArgs),
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// Number of machines (the first COUNT of the fleet `inventory` wrote).
    #[arg(long, default_value_t = 1000)]
    count: usize,
    /// The client namespace's interface facing Plinth (DHCP goes out and comes back on it).
    #[arg(long)]
    iface: String,
    /// Plinth's address: DHCP server identifier, TFTP server, HTTP host.
    #[arg(long)]
    server: Ipv4Addr,
    /// At most this many machines booting at once (default: all of them).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Machines power on at random moments within this many milliseconds (0: all at once).
    #[arg(long, default_value_t = 0)]
    ramp_ms: u64,
    /// First DHCP timeout; doubles per retry as PXE firmware does (4, 8, 16, 32 s).
    #[arg(long, default_value_t = 4000)]
    dhcp_timeout_ms: u64,
    /// DHCP transmissions per message before the machine gives up.
    #[arg(long, default_value_t = 4)]
    dhcp_tries: u32,
    /// TFTP retransmission timeout.
    #[arg(long, default_value_t = 2000)]
    tftp_timeout_ms: u64,
    /// TFTP transmissions of one packet before the transfer is abandoned.
    #[arg(long, default_value_t = 6)]
    tftp_tries: u32,
    /// HTTP attempts per request (iPXE's scripts retry, Talos retries its config fetch).
    #[arg(long, default_value_t = 4)]
    http_tries: u32,
    /// Time limit of one HTTP request, seconds (a kernel or initramfs download included).
    #[arg(long, default_value_t = 600)]
    http_timeout_s: u64,
    /// The `/boot.ipxe` URL Plinth's DHCP hands to iPXE (default http://SERVER:8080/boot.ipxe).
    #[arg(long)]
    boot_url: Option<String>,
    /// Write the report as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
}

// ---------------------------------------------------------------------------------------------
// The fleet

/// Firmware of a simulated machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Firmware {
    /// Legacy BIOS PXE: option 93 = 0, boots `undionly.kpxe`.
    Bios,
    /// UEFI x86-64 PXE: option 93 = 7, boots `ipxe.efi`.
    Uefi,
}

/// One simulated machine's identity.
#[derive(Clone, Debug)]
struct Identity {
    mac: [u8; 6],
    uuid: String,
    serial: String,
    hostname: String,
    firmware: Firmware,
}

fn identity(i: usize) -> Identity {
    Identity {
        mac: [0x52, 0x54, 0x00, 0x5b, (i >> 8) as u8, i as u8],
        uuid: format!("5b0075e0-0000-4000-8000-{i:012x}"),
        serial: format!("STORM-{i:05}"),
        hostname: format!("storm-{i:05}"),
        // Half the fleet is legacy BIOS, half UEFI.
        firmware: if i % 2 == 0 {
            Firmware::Bios
        } else {
            Firmware::Uefi
        },
    }
}

impl Identity {
    fn mac_colon(&self) -> String {
        self.mac
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    }

    fn uuid_bytes(&self) -> [u8; 16] {
        *uuid::Uuid::parse_str(&self.uuid)
            .expect("fleet UUIDs are valid")
            .as_bytes()
    }

    /// DHCP option 93 (RFC 4578 section 2.1).
    fn arch(&self) -> u16 {
        match self.firmware {
            Firmware::Bios => 0,
            Firmware::Uefi => 7,
        }
    }

    /// The binary Plinth must name for this firmware.
    fn ipxe_file(&self) -> &'static str {
        match self.firmware {
            Firmware::Bios => "undionly.kpxe",
            Firmware::Uefi => "ipxe.efi",
        }
    }

    /// iPXE's `${buildarch}` and `${platform}` for the binary it runs.
    fn buildarch_platform(&self) -> (&'static str, &'static str) {
        match self.firmware {
            Firmware::Bios => ("i386", "pcbios"),
            Firmware::Uefi => ("x86_64", "efi"),
        }
    }
}

fn write_inventory(
    count: usize,
    dir: &std::path::Path,
    cluster: &str,
    profile: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for i in 0..count {
        let m = identity(i);
        let doc = format!(
            "kind: Machine\nhostname: {host}\nsmbios_uuid: {uuid}\nserial: {serial}\nrole: worker\n\
             cluster: {cluster}\nprofile: {profile}\n\
             interfaces:\n  - mac: \"{mac}\"\n    boot: true\n\
             disks:\n  - serial: {serial}-D0\n    model: STORM SSD\n    size_bytes: 480103981056\n    type: ssd\n\
             \x20 - serial: {serial}-D1\n    model: STORM HDD\n    size_bytes: 4000787030016\n    type: hdd\n",
            host = m.hostname,
            uuid = m.uuid,
            serial = m.serial,
            mac = m.mac_colon(),
        );
        std::fs::write(dir.join(format!("{}.yaml", m.hostname)), doc)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Stages and what a machine reports

const STAGES: [&str; 9] = [
    "discover->offer",
    "request->ack",
    "tftp",
    "ipxe dhcp",
    "boot.ipxe",
    "machine.ipxe",
    "kernel",
    "initramfs",
    "config",
];
const S_OFFER: usize = 0;
const S_ACK: usize = 1;
const S_TFTP: usize = 2;
const S_IPXE_DHCP: usize = 3;
const S_BOOT_IPXE: usize = 4;
const S_MACHINE_IPXE: usize = 5;
const S_KERNEL: usize = 6;
const S_INITRAMFS: usize = 7;
const S_CONFIG: usize = 8;

/// What one machine went through.
#[derive(Default)]
struct Outcome {
    stages: [Option<Duration>; STAGES.len()],
    /// Retransmissions and repeated requests, per stage.
    retries: [u32; STAGES.len()],
    /// Since the storm started: power-on, and the config in hand.
    started: Duration,
    done: Option<Duration>,
    error: Option<String>,
    bytes: u64,
}

// ---------------------------------------------------------------------------------------------
// DHCP: one socket on 0.0.0.0:68 for the whole fleet, replies demultiplexed by xid and chaddr

/// Who waits for the replies of one transaction: its MAC (chaddr) and where to hand them.
type Waiter = ([u8; 6], mpsc::UnboundedSender<v4::Message>);

struct DhcpBus {
    sock: Arc<UdpSocket>,
    waiters: Mutex<HashMap<u32, Waiter>>,
}

impl DhcpBus {
    fn bind(iface: &str) -> anyhow::Result<Arc<DhcpBus>> {
        use socket2::{Domain, Protocol, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        s.set_reuse_address(true)?;
        s.set_broadcast(true)?;
        s.bind_device(Some(iface.as_bytes()))
            .with_context(|| format!("SO_BINDTODEVICE {iface}"))?;
        // A thousand OFFERs arrive within milliseconds: room for all of them (capped by rmem_max).
        s.set_recv_buffer_size(8 << 20)?;
        s.set_nonblocking(true)?;
        s.bind(&SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68)).into())
            .context("bind 0.0.0.0:68")?;
        let bus = Arc::new(DhcpBus {
            sock: Arc::new(UdpSocket::from_std(s.into())?),
            waiters: Mutex::new(HashMap::new()),
        });
        let rx = bus.clone();
        tokio::spawn(async move { rx.receive().await });
        Ok(bus)
    }

    async fn receive(self: Arc<Self>) {
        let mut buf = vec![0u8; 2048];
        loop {
            let Ok((n, _)) = self.sock.recv_from(&mut buf).await else {
                continue;
            };
            let Ok(msg) = v4::Message::decode(&mut Decoder::new(&buf[..n])) else {
                continue;
            };
            if msg.opcode() != v4::Opcode::BootReply {
                continue;
            }
            let waiters = self.waiters.lock().expect("waiters");
            if let Some((mac, tx)) = waiters.get(&msg.xid()) {
                if msg.chaddr().get(..6) == Some(&mac[..]) {
                    let _ = tx.send(msg);
                }
            }
        }
    }

    fn register(&self, xid: u32, mac: [u8; 6]) -> mpsc::UnboundedReceiver<v4::Message> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.waiters.lock().expect("waiters").insert(xid, (mac, tx));
        rx
    }

    fn unregister(&self, xid: u32) {
        self.waiters.lock().expect("waiters").remove(&xid);
    }

    async fn send(&self, msg: &v4::Message) -> anyhow::Result<()> {
        let mut out = Vec::with_capacity(400);
        msg.encode(&mut Encoder::new(&mut out))?;
        // Firmware pads to the BOOTP minimum of 300 bytes (RFC 1542 section 2.1).
        if out.len() < 300 {
            out.resize(300, 0);
        }
        self.sock
            .send_to(&out, SocketAddrV4::new(Ipv4Addr::BROADCAST, 67))
            .await?;
        Ok(())
    }
}

/// Which DHCP round: the firmware's PXE client, or iPXE once it runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Round {
    Firmware,
    Ipxe,
}

struct Lease {
    ip: Ipv4Addr,
    boot_file: String,
}

fn request_message(m: &Identity, round: Round, xid: u32, kind: MessageType) -> v4::Message {
    let mut msg = v4::Message::new_with_id(
        xid,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &m.mac,
    );
    // Firmware asks for a broadcast answer: it has no address yet (RFC 2131 section 4.1).
    msg.set_flags(v4::Flags::default().set_broadcast());
    let o = msg.opts_mut();
    o.insert(DhcpOption::MessageType(kind));
    o.insert(DhcpOption::MaxMessageSize(1472)); // option 57
    o.insert(DhcpOption::ClientSystemArchitecture(m.arch().into())); // option 93, RFC 4578
    o.insert(DhcpOption::ClientNetworkInterface(1, 3, 16)); // option 94: UNDI 3.16
    let mut guid = vec![0u8]; // option 97: type 0, then the SMBIOS UUID
    guid.extend_from_slice(&m.uuid_bytes());
    o.insert(DhcpOption::ClientMachineIdentifier(guid));
    o.insert(DhcpOption::ClassIdentifier(
        format!("PXEClient:Arch:{:05}:UNDI:003016", m.arch()).into_bytes(),
    )); // option 60
    let mut prl = vec![
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::DomainNameServer,
        OptionCode::DomainName,
        OptionCode::TFTPServerName,          // 66
        OptionCode::BootfileName,            // 67
        OptionCode::VendorExtensions,        // 43
        OptionCode::ClassIdentifier,         // 60
        OptionCode::ClientMachineIdentifier, // 97
    ];
    if round == Round::Ipxe {
        // iPXE identifies itself (option 77) and its features (option 175, encapsulated:
        // 19 HTTP, 23 DNS, 24 TFTP... each = 1).
        o.insert(DhcpOption::UserClass(b"iPXE".to_vec()));
        o.insert(DhcpOption::Unknown(v4::UnknownOption::new(
            OptionCode::from(175),
            vec![19, 1, 1, 23, 1, 1, 24, 1, 1, 33, 1, 1, 16, 1, 2],
        )));
        let mut cid = vec![1u8]; // option 61: htype Ethernet + MAC, as iPXE sends
        cid.extend_from_slice(&m.mac);
        o.insert(DhcpOption::ClientIdentifier(cid));
        prl.push(OptionCode::from(175));
    }
    o.insert(DhcpOption::ParameterRequestList(prl));
    msg
}

fn message_type(m: &v4::Message) -> Option<MessageType> {
    m.opts().msg_type()
}

fn boot_file(m: &v4::Message) -> Option<String> {
    match m.opts().get(OptionCode::BootfileName) {
        Some(DhcpOption::BootfileName(b)) => Some(
            String::from_utf8_lossy(b)
                .trim_end_matches('\0')
                .to_string(),
        ),
        _ => m
            .fname_str()
            .and_then(Result::ok)
            .map(|s| s.trim_end_matches('\0').to_string())
            .filter(|s| !s.is_empty()),
    }
}

fn server_id(m: &v4::Message) -> Option<Ipv4Addr> {
    match m.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
        _ => None,
    }
}

/// Send `msg` and wait for an answer of one of `want`, with PXE's doubling timeouts. The time
/// from the first transmission, and the answer.
async fn exchange(
    bus: &DhcpBus,
    rx: &mut mpsc::UnboundedReceiver<v4::Message>,
    msg: &v4::Message,
    want: &[MessageType],
    args: &RunArgs,
    retries: &mut u32,
) -> anyhow::Result<(Duration, v4::Message)> {
    let start = Instant::now();
    let mut timeout = Duration::from_millis(args.dhcp_timeout_ms);
    for attempt in 0..args.dhcp_tries {
        if attempt > 0 {
            *retries += 1;
        }
        bus.send(msg).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => break,
                Ok(None) => bail!("dhcp receiver gone"),
                Ok(Some(reply)) => {
                    if let Some(t) = message_type(&reply) {
                        if want.contains(&t) {
                            return Ok((start.elapsed(), reply));
                        }
                    }
                }
            }
        }
        timeout = (timeout * 2).min(Duration::from_secs(32));
    }
    bail!("no {:?} after {} transmissions", want, args.dhcp_tries)
}

/// A whole DORA. Records discover->offer and request->ack for the firmware round; the iPXE round
/// is one stage.
async fn dora(
    bus: &DhcpBus,
    m: &Identity,
    round: Round,
    server: Ipv4Addr,
    args: &RunArgs,
    out: &mut Outcome,
) -> anyhow::Result<Lease> {
    let round_start = Instant::now();
    // A NAK restarts the exchange from DISCOVER (RFC 2131 section 3.1); at most a few times.
    for _ in 0..3 {
        let xid: u32 = rand::random();
        let mut rx = bus.register(xid, m.mac);
        let r = dora_once(bus, &mut rx, m, round, xid, server, args, out).await;
        bus.unregister(xid);
        match r {
            Ok(Some(lease)) => {
                if round == Round::Ipxe {
                    out.stages[S_IPXE_DHCP] = Some(round_start.elapsed());
                }
                return Ok(lease);
            }
            Ok(None) => {
                out.retries[if round == Round::Ipxe {
                    S_IPXE_DHCP
                } else {
                    S_ACK
                }] += 1;
            }
            Err(e) => return Err(e),
        }
    }
    bail!("NAK after NAK")
}

#[allow(clippy::too_many_arguments)]
async fn dora_once(
    bus: &DhcpBus,
    rx: &mut mpsc::UnboundedReceiver<v4::Message>,
    m: &Identity,
    round: Round,
    xid: u32,
    server: Ipv4Addr,
    args: &RunArgs,
    out: &mut Outcome,
) -> anyhow::Result<Option<Lease>> {
    let (s_offer, s_ack) = match round {
        Round::Firmware => (S_OFFER, S_ACK),
        Round::Ipxe => (S_IPXE_DHCP, S_IPXE_DHCP),
    };
    let discover = request_message(m, round, xid, MessageType::Discover);
    let (t, offer) = exchange(
        bus,
        rx,
        &discover,
        &[MessageType::Offer],
        args,
        &mut out.retries[s_offer],
    )
    .await
    .context("DISCOVER")?;
    if round == Round::Firmware {
        out.stages[S_OFFER] = Some(t);
    }
    let sid = server_id(&offer).ok_or_else(|| anyhow!("OFFER without option 54"))?;
    if sid != server {
        bail!("OFFER from {sid}, expected {server}");
    }
    let ip = offer.yiaddr();
    if ip.is_unspecified() {
        bail!("OFFER without an address");
    }
    let want_file = expected_boot_file(m, round, server, args);
    let file = boot_file(&offer).unwrap_or_default();
    if file != want_file {
        bail!("OFFER names boot file {file:?}, expected {want_file:?}");
    }
    let mut request = request_message(m, round, xid, MessageType::Request);
    request
        .opts_mut()
        .insert(DhcpOption::RequestedIpAddress(ip)); // option 50
    request.opts_mut().insert(DhcpOption::ServerIdentifier(sid)); // option 54
    let (t, ack) = exchange(
        bus,
        rx,
        &request,
        &[MessageType::Ack, MessageType::Nak],
        args,
        &mut out.retries[s_ack],
    )
    .await
    .context("REQUEST")?;
    if message_type(&ack) == Some(MessageType::Nak) {
        return Ok(None);
    }
    if round == Round::Firmware {
        out.stages[S_ACK] = Some(t);
    }
    if ack.yiaddr() != ip {
        bail!("ACK of {} after an OFFER of {ip}", ack.yiaddr());
    }
    let file = boot_file(&ack).unwrap_or_default();
    if file != want_file {
        bail!("ACK names boot file {file:?}, expected {want_file:?}");
    }
    Ok(Some(Lease {
        ip,
        boot_file: file,
    }))
}

fn expected_boot_file(m: &Identity, round: Round, server: Ipv4Addr, args: &RunArgs) -> String {
    match (round, &args.boot_url) {
        (Round::Firmware, _) => m.ipxe_file().to_string(),
        (Round::Ipxe, Some(url)) => url.clone(),
        (Round::Ipxe, None) => format!("http://{server}:8080/boot.ipxe"),
    }
}

// ---------------------------------------------------------------------------------------------
// TFTP read client (RFC 1350; options RFC 2347, blksize RFC 2348, tsize RFC 2349)

const TFTP_RRQ: u16 = 1;
const TFTP_DATA: u16 = 3;
const TFTP_ACK: u16 = 4;
const TFTP_ERROR: u16 = 5;
const TFTP_OACK: u16 = 6;

fn tftp_ack(block: u16) -> [u8; 4] {
    let b = block.to_be_bytes();
    [0, TFTP_ACK as u8, b[0], b[1]]
}

/// Read `file` from `server` (port 69) from `local`; the bytes received. Retransmissions are added
/// to `retries`.
async fn tftp_get(
    local: Ipv4Addr,
    server: Ipv4Addr,
    file: &str,
    args: &RunArgs,
    retries: &mut u32,
) -> anyhow::Result<u64> {
    const BLKSIZE: usize = 1468;
    let sock = UdpSocket::bind(SocketAddrV4::new(local, 0))
        .await
        .with_context(|| format!("bind {local}"))?;
    let mut rrq = Vec::with_capacity(64);
    rrq.extend_from_slice(&TFTP_RRQ.to_be_bytes());
    for field in [file, "octet", "blksize", "1468", "tsize", "0"] {
        rrq.extend_from_slice(field.as_bytes());
        rrq.push(0);
    }
    let timeout = Duration::from_millis(args.tftp_timeout_ms);
    let mut last: Vec<u8> = rrq;
    let mut dest = SocketAddr::V4(SocketAddrV4::new(server, 69));
    let mut peer: Option<SocketAddr> = None;
    let mut blksize = 512usize;
    let mut tsize: Option<u64> = None;
    let mut expected: u16 = 1;
    let mut received: u64 = 0;
    let mut silent = 0u32;
    let mut buf = vec![0u8; BLKSIZE + 64];
    sock.send_to(&last, dest).await?;
    loop {
        let (n, from) = match tokio::time::timeout(timeout, sock.recv_from(&mut buf)).await {
            Err(_) => {
                silent += 1;
                if silent >= args.tftp_tries {
                    bail!("TFTP {file}: no answer after {silent} transmissions (block {expected})");
                }
                *retries += 1;
                sock.send_to(&last, dest).await?;
                continue;
            }
            Ok(r) => r?,
        };
        match peer {
            Some(p) if p != from => {
                // RFC 1350 section 4: a packet from another TID gets an error, the transfer goes on.
                let mut e = vec![0, TFTP_ERROR as u8, 0, 5];
                e.extend_from_slice(b"unknown transfer id\0");
                let _ = sock.send_to(&e, from).await;
                continue;
            }
            Some(_) => {}
            None => {
                if from.ip() != IpAddr::V4(server) {
                    continue;
                }
                peer = Some(from);
                dest = from;
            }
        }
        if n < 4 {
            continue;
        }
        let op = u16::from_be_bytes([buf[0], buf[1]]);
        match op {
            TFTP_OACK if expected == 1 && received == 0 => {
                let mut fields = buf[2..n]
                    .split(|b| *b == 0)
                    .map(|f| String::from_utf8_lossy(f).to_ascii_lowercase());
                while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
                    match k.as_str() {
                        "blksize" => {
                            blksize = v.parse().context("OACK blksize")?;
                            if !(8..=BLKSIZE).contains(&blksize) {
                                bail!("OACK blksize {blksize} beyond what was asked");
                            }
                        }
                        "tsize" => tsize = Some(v.parse().context("OACK tsize")?),
                        _ => {}
                    }
                }
                last = tftp_ack(0).to_vec();
                silent = 0;
                sock.send_to(&last, dest).await?;
            }
            TFTP_DATA => {
                let block = u16::from_be_bytes([buf[2], buf[3]]);
                if block == expected {
                    let len = n - 4;
                    received += len as u64;
                    last = tftp_ack(block).to_vec();
                    silent = 0;
                    sock.send_to(&last, dest).await?;
                    if len < blksize {
                        break;
                    }
                    expected = expected.wrapping_add(1);
                } else if block == expected.wrapping_sub(1) {
                    // Our ACK was lost or late: the server sent the block again. Acknowledge again.
                    sock.send_to(&tftp_ack(block), dest).await?;
                }
            }
            TFTP_ERROR => {
                let code = u16::from_be_bytes([buf[2], buf[3]]);
                let msg = String::from_utf8_lossy(&buf[4..n])
                    .trim_end_matches('\0')
                    .to_string();
                bail!("TFTP {file}: error {code} {msg:?}");
            }
            _ => {}
        }
    }
    if let Some(t) = tsize {
        if t != received {
            bail!("TFTP {file}: tsize {t} but {received} bytes received");
        }
    }
    Ok(received)
}

// ---------------------------------------------------------------------------------------------
// HTTP, as iPXE and Talos do it

/// iPXE's setting expansion: `${name}` and `${name:type}`, unknown names become empty.
fn expand(s: &str, vars: &HashMap<&str, String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let Some(j) = rest[i..].find('}') else {
            out.push_str(&rest[i..]);
            return out;
        };
        let name = &rest[i + 2..i + j];
        out.push_str(vars.get(name).map(String::as_str).unwrap_or(""));
        rest = &rest[i + j + 1..];
    }
    out.push_str(rest);
    out
}

fn ipxe_vars(m: &Identity) -> HashMap<&'static str, String> {
    let (buildarch, platform) = m.buildarch_platform();
    let hyp = m.mac_colon().replace(':', "-");
    HashMap::from([
        ("mac", m.mac_colon()),
        ("mac:hexhyp", hyp.clone()),
        ("net0/mac", m.mac_colon()),
        ("net0/mac:hexhyp", hyp),
        ("uuid", m.uuid.clone()),
        ("serial", m.serial.clone()),
        ("serial:uristring", m.serial.clone()),
        ("manufacturer", "Storm".into()),
        ("manufacturer:uristring", "Storm".into()),
        ("product", "Simulated".into()),
        ("product:uristring", "Simulated".into()),
        ("asset", String::new()),
        ("asset:uristring", String::new()),
        ("buildarch", buildarch.into()),
        ("platform", platform.into()),
    ])
}

/// GET with retries: 5xx, transport errors and (for the config) any non-200 are tried again after
/// a pause, as iPXE's `|| goto failed` loop and Talos' back-off do.
async fn get_with_retries(
    client: &reqwest::Client,
    url: &str,
    args: &RunArgs,
    retries: &mut u32,
) -> anyhow::Result<reqwest::Response> {
    let mut last = String::new();
    for attempt in 0..args.http_tries {
        if attempt > 0 {
            *retries += 1;
            tokio::time::sleep(Duration::from_millis(500 << attempt.min(4))).await;
        }
        match client.get(url).send().await {
            Ok(r) if r.status() == reqwest::StatusCode::OK => return Ok(r),
            Ok(r) => last = format!("status {}", r.status()),
            Err(e) => last = format!("{e:#}"),
        }
    }
    bail!(
        "GET {}: {last} after {} attempts",
        strip_query(url),
        args.http_tries
    )
}

/// A URL without its query (the config URL carries the boot's token: never printed).
fn strip_query(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

/// Download `url`, counting bytes and keeping none; checks Content-Length.
async fn download(
    client: &reqwest::Client,
    url: &str,
    args: &RunArgs,
    retries: &mut u32,
) -> anyhow::Result<u64> {
    for attempt in 0..args.http_tries {
        if attempt > 0 {
            *retries += 1;
        }
        let mut r = get_with_retries(client, url, args, retries).await?;
        let want = r.content_length();
        let mut got = 0u64;
        let mut failed = None;
        loop {
            match r.chunk().await {
                Ok(Some(c)) => got += c.len() as u64,
                Ok(None) => break,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match (failed, want) {
            (None, Some(w)) if w == got => return Ok(got),
            (None, None) if got > 0 => return Ok(got),
            (None, w) => bail!(
                "GET {}: {got} bytes, Content-Length {w:?}",
                strip_query(url)
            ),
            (Some(e), _) if attempt + 1 == args.http_tries => {
                bail!(
                    "GET {}: body failed after {got} bytes: {e:#}",
                    strip_query(url)
                )
            }
            (Some(_), _) => continue,
        }
    }
    bail!("GET {}: no complete body", strip_query(url))
}

/// What the per-machine script says to boot.
struct InstallScript {
    kernel: String,
    initrd: String,
    config: String,
}

/// Read the `kernel` and `initrd` lines of an iPXE install script and the `talos.config=` argument.
fn parse_install_script(
    script: &str,
    vars: &HashMap<&str, String>,
) -> anyhow::Result<InstallScript> {
    let mut kernel = None;
    let mut initrd = None;
    let mut config = None;
    for line in script.lines() {
        let line = expand(line.split(" || ").next().unwrap_or(line).trim(), vars);
        let mut words = line.split_whitespace();
        match words.next() {
            Some("kernel") => {
                let rest: Vec<&str> = words.filter(|w| !w.starts_with("--")).collect();
                kernel = rest.first().map(|s| s.to_string());
                config = rest
                    .iter()
                    .find_map(|w| w.strip_prefix("talos.config="))
                    .map(str::to_string);
            }
            Some("initrd") => {
                let rest: Vec<&str> = words.collect();
                // `initrd --name NAME URL`
                let mut i = 0;
                while i < rest.len() && rest[i].starts_with("--") {
                    i += if rest[i] == "--name" { 2 } else { 1 };
                }
                initrd = rest.get(i).map(|s| s.to_string());
            }
            _ => {}
        }
    }
    match (kernel, initrd, config) {
        (Some(kernel), Some(initrd), Some(config)) => Ok(InstallScript {
            kernel,
            initrd,
            config,
        }),
        _ => {
            let first = script
                .lines()
                .find(|l| l.starts_with("echo"))
                .unwrap_or("")
                .to_string();
            bail!("the machine script is not an install: {first}")
        }
    }
}

fn first_chain(script: &str) -> Option<&str> {
    script.lines().find_map(|l| {
        let l = l.trim();
        let rest = l.strip_prefix("chain ")?;
        rest.split_whitespace().find(|w| !w.starts_with("--"))
    })
}

// ---------------------------------------------------------------------------------------------
// One machine

async fn boot(
    bus: Arc<DhcpBus>,
    m: Identity,
    args: Arc<RunArgs>,
    storm: Instant,
    out: &mut Outcome,
) -> anyhow::Result<()> {
    out.started = storm.elapsed();
    let server = args.server;
    // 1. The firmware's DHCP: an address and the iPXE binary for this firmware.
    let lease = dora(&bus, &m, Round::Firmware, server, &args, out).await?;
    // 2. TFTP of that binary, from the leased address.
    let t = Instant::now();
    let n = tftp_get(
        lease.ip,
        server,
        &lease.boot_file,
        &args,
        &mut out.retries[S_TFTP],
    )
    .await?;
    out.stages[S_TFTP] = Some(t.elapsed());
    out.bytes += n;
    // 3. iPXE starts and asks DHCP again, as iPXE: it gets the URL of /boot.ipxe.
    let lease2 = dora(&bus, &m, Round::Ipxe, server, &args, out).await?;
    let ip = lease2.ip;
    let client = reqwest::Client::builder()
        .local_address(IpAddr::V4(ip))
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(args.http_timeout_s))
        .pool_max_idle_per_host(1)
        .user_agent("iPXE/1.21.1+ (g4bd064de)")
        .build()?;
    let vars = ipxe_vars(&m);
    // 4. /boot.ipxe, then the machine's own script it chains to.
    let t = Instant::now();
    let generic = get_with_retries(
        &client,
        &lease2.boot_file,
        &args,
        &mut out.retries[S_BOOT_IPXE],
    )
    .await?
    .text()
    .await?;
    out.stages[S_BOOT_IPXE] = Some(t.elapsed());
    let chain = first_chain(&generic).ok_or_else(|| anyhow!("/boot.ipxe chains nowhere"))?;
    let url = expand(chain, &vars);
    let t = Instant::now();
    let script = get_with_retries(&client, &url, &args, &mut out.retries[S_MACHINE_IPXE])
        .await?
        .text()
        .await?;
    out.stages[S_MACHINE_IPXE] = Some(t.elapsed());
    let install = parse_install_script(&script, &vars)?;
    // 5. Kernel and initramfs, in that order (iPXE's `kernel` then `initrd`).
    let t = Instant::now();
    out.bytes += download(&client, &install.kernel, &args, &mut out.retries[S_KERNEL]).await?;
    out.stages[S_KERNEL] = Some(t.elapsed());
    let t = Instant::now();
    out.bytes += download(
        &client,
        &install.initrd,
        &args,
        &mut out.retries[S_INITRAMFS],
    )
    .await?;
    out.stages[S_INITRAMFS] = Some(t.elapsed());
    // 6. Talos: its config, with ${uuid} substituted in the query string. Same leased address
    //    (Talos' DHCP gets the machine's lease again).
    let config_url = install.config.replace("${uuid}", &m.uuid);
    let t = Instant::now();
    let resp = get_with_retries(&client, &config_url, &args, &mut out.retries[S_CONFIG]).await?;
    let yaml = resp.text().await?;
    out.stages[S_CONFIG] = Some(t.elapsed());
    out.bytes += yaml.len() as u64;
    if !yaml.lines().any(|l| l.starts_with("machine:")) {
        bail!("the config is not a Talos machine config");
    }
    if !yaml.contains(&format!("hostname: {}", m.hostname)) {
        bail!(
            "the config is not this machine's (no hostname {})",
            m.hostname
        );
    }
    out.done = Some(storm.elapsed());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The report

#[derive(Serialize)]
struct StageReport {
    stage: &'static str,
    count: usize,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    retries: u64,
}

#[derive(Serialize)]
struct Report {
    machines: usize,
    concurrency: usize,
    ramp_ms: u64,
    configs: usize,
    errors: usize,
    retries: u64,
    seconds_to_last_config: f64,
    per_machine_total: StageReport,
    stages: Vec<StageReport>,
    bytes: u64,
    error_samples: Vec<String>,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

fn stage_report(stage: &'static str, mut v: Vec<Duration>, retries: u64) -> StageReport {
    v.sort();
    StageReport {
        stage,
        count: v.len(),
        p50_ms: percentile(&v, 50.0),
        p90_ms: percentile(&v, 90.0),
        p99_ms: percentile(&v, 99.0),
        max_ms: percentile(&v, 100.0),
        retries,
    }
}

fn print_report(r: &Report) {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    t.set_header([
        "stage", "n", "p50 ms", "p90 ms", "p99 ms", "max ms", "retries",
    ]);
    for s in r.stages.iter().chain(std::iter::once(&r.per_machine_total)) {
        t.add_row([
            s.stage.to_string(),
            s.count.to_string(),
            format!("{:.1}", s.p50_ms),
            format!("{:.1}", s.p90_ms),
            format!("{:.1}", s.p99_ms),
            format!("{:.1}", s.max_ms),
            s.retries.to_string(),
        ]);
    }
    println!("{t}");
    println!(
        "machines {}  configs {}  errors {}  retries {}  concurrency {}  ramp {} ms",
        r.machines, r.configs, r.errors, r.retries, r.concurrency, r.ramp_ms
    );
    println!(
        "time to the last config: {:.2} s   ({:.1} GB moved)",
        r.seconds_to_last_config,
        r.bytes as f64 / 1e9
    );
    for e in &r.error_samples {
        println!("error: {e}");
    }
}

async fn run(args: RunArgs) -> anyhow::Result<bool> {
    let args = Arc::new(args);
    let bus = DhcpBus::bind(&args.iface)?;
    let concurrency = args.concurrency.unwrap_or(args.count).max(1);
    let gate = Arc::new(Semaphore::new(concurrency));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let storm = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.count {
        let (bus, args, gate, done, failed) = (
            bus.clone(),
            args.clone(),
            gate.clone(),
            done.clone(),
            failed.clone(),
        );
        tasks.spawn(async move {
            if args.ramp_ms > 0 {
                let at = rand::random::<u64>() % args.ramp_ms;
                tokio::time::sleep(Duration::from_millis(at)).await;
            }
            let _permit = gate.acquire_owned().await.expect("gate");
            let m = identity(i);
            let mut out = Outcome::default();
            if let Err(e) = boot(bus, m.clone(), args, storm, &mut out).await {
                out.error = Some(format!("{} ({}): {e:#}", m.hostname, m.mac_colon()));
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            } else {
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            out
        });
    }
    let progress = {
        let (done, failed, count) = (done.clone(), failed.clone(), args.count);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                eprintln!(
                    "[{:6.1} s] configs {}/{count}, errors {}",
                    storm.elapsed().as_secs_f64(),
                    done.load(std::sync::atomic::Ordering::Relaxed),
                    failed.load(std::sync::atomic::Ordering::Relaxed)
                );
            }
        })
    };
    let mut outcomes = Vec::with_capacity(args.count);
    while let Some(r) = tasks.join_next().await {
        outcomes.push(r?);
    }
    progress.abort();

    let mut stages = Vec::new();
    for (k, name) in STAGES.iter().enumerate() {
        let v: Vec<Duration> = outcomes.iter().filter_map(|o| o.stages[k]).collect();
        let retries: u64 = outcomes.iter().map(|o| u64::from(o.retries[k])).sum();
        stages.push(stage_report(name, v, retries));
    }
    let totals: Vec<Duration> = outcomes
        .iter()
        .filter_map(|o| o.done.map(|d| d.saturating_sub(o.started)))
        .collect();
    let retries: u64 = stages.iter().map(|s| s.retries).sum();
    let errors: Vec<&String> = outcomes.iter().filter_map(|o| o.error.as_ref()).collect();
    let report = Report {
        machines: args.count,
        concurrency,
        ramp_ms: args.ramp_ms,
        configs: outcomes.iter().filter(|o| o.done.is_some()).count(),
        errors: errors.len(),
        retries,
        seconds_to_last_config: outcomes
            .iter()
            .filter_map(|o| o.done)
            .max()
            .unwrap_or_default()
            .as_secs_f64(),
        per_machine_total: stage_report("power-on -> config", totals, retries),
        stages,
        bytes: outcomes.iter().map(|o| o.bytes).sum(),
        error_samples: errors.iter().take(10).map(|s| s.to_string()).collect(),
    };
    print_report(&report);
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(report.errors == 0 && report.configs == args.count)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Inventory {
            count,
            dir,
            cluster,
            profile,
        } => write_inventory(count, &dir, &cluster, &profile),
        Cmd::Run(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            if rt.block_on(run(args))? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
    }
}

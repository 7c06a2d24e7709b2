//! Plinth's DHCP server against real peers in network namespaces the tests create: ISC perfdhcp
//! (thousands of clients, and as a relay with option 82), dnsmasq owning the addresses while
//! Plinth answers PXE clients as a proxyDHCP server, hostile packets over the wire, and two Plinth
//! processes sharing one PostgreSQL pool under perfdhcp load. Every namespace and process is
//! removed on drop (processes by PID); every wait is bounded.
//!
//! Needs root (namespaces, port 67), `perfdhcp` (Debian kea-admin), `dnsmasq` (dnsmasq-base),
//! `curl`, and for the last test PostgreSQL at DATABASE_URL.

use crate::support;

use crate::support::lan;
use crate::support::peers;

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use dhcproto::v4::{self, DhcpOption, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use lan::Lan;
use peers::{bound_by_mac, lease_rows, metrics, perfdhcp, sample, start_plinth, Agent};
use support::{Backend, TestDb};

fn mac_of(lan: &Lan, host: &lan::Host) -> [u8; 6] {
    let out = lan
        .cmd(host, "cat")
        .arg(format!("/sys/class/net/{}/address", host.ifname))
        .output()
        .expect("cat");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u8> = text
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).expect("hex"))
        .collect();
    v.try_into().expect("6 bytes")
}

pub(crate) fn encode(m: &v4::Message) -> Vec<u8> {
    let mut out = Vec::new();
    m.encode(&mut Encoder::new(&mut out)).expect("encode");
    out
}

pub(crate) fn decode(b: &[u8]) -> v4::Message {
    v4::Message::decode(&mut Decoder::new(b)).expect("a decodable reply")
}

pub(crate) fn msg_type(m: &v4::Message) -> Option<MessageType> {
    m.opts().msg_type()
}

fn opt_bytes(m: &v4::Message, code: OptionCode) -> Option<Vec<u8>> {
    match m.opts().get(code)? {
        DhcpOption::ClassIdentifier(v) => Some(v.clone()),
        DhcpOption::BootfileName(v) => Some(v.clone()),
        _ => None,
    }
}

fn server_id(m: &v4::Message) -> Option<Ipv4Addr> {
    match m.opts().get(OptionCode::ServerIdentifier)? {
        DhcpOption::ServerIdentifier(ip) => Some(*ip),
        _ => None,
    }
}

/// A client message from `mac` with broadcast flag and the PXE options of a UEFI x86-64 client.
pub(crate) fn pxe_message(
    mac: &[u8; 6],
    xid: u32,
    kind: MessageType,
    ciaddr: Ipv4Addr,
) -> v4::Message {
    let mut m = v4::Message::new(
        ciaddr,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        mac,
    );
    m.set_xid(xid)
        .set_flags(v4::Flags::default().set_broadcast());
    let o = m.opts_mut();
    o.insert(DhcpOption::MessageType(kind));
    o.insert(DhcpOption::ClientSystemArchitecture(7.into())); // option 93: x86-64 UEFI
    o.insert(DhcpOption::ClassIdentifier(
        b"PXEClient:Arch:00007:UNDI:003016".to_vec(),
    )); // option 60
    o.insert(DhcpOption::ParameterRequestList(vec![
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::ClassIdentifier,
        OptionCode::BootfileName,
    ]));
    m
}

/// Collect replies with `xid` for `window`.
pub(crate) fn collect(
    agent: &mut Agent,
    xid: u32,
    window: Duration,
) -> Vec<(SocketAddr, v4::Message)> {
    let end = Instant::now() + window;
    let mut got = Vec::new();
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        let Some((from, bytes)) = agent.recv(left.max(Duration::from_millis(1))) else {
            break;
        };
        let m = decode(&bytes);
        if m.xid() == xid && m.opcode() == v4::Opcode::BootReply {
            got.push((from, m));
        }
    }
    got
}

const AUTH_SUBNET: &str = r#"boot_url = "http://10.78.0.1:8080"
[[dhcp.subnet]]
cidr = "10.78.0.0/20"
mode = "authoritative"
server_ip = "10.78.0.1"
pool = ["10.78.1.0-10.78.15.254"]
routers = ["10.78.0.1"]
lease_seconds = 3600
# perfdhcp's clients are all unknown to the inventory, and more than half the pool
unknown_share = 1.0
"#;

/// perfdhcp simulates `clients` distinct clients (it always talks as a relay: giaddr is its own
/// address and answers come back to it on port 67); every one completes DORA; the lease table
/// then holds exactly those clients, one address each, matching what perfdhcp was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perfdhcp_thousands_of_clients_complete_dora() {
    const CLIENTS: usize = 2000;
    let tmp = tempfile::tempdir().expect("tmp");
    let db = TestDb::new(Backend::Sqlite).await;
    let mut lan = Lan::new("pf");
    let srv = lan.host(&["10.78.0.1/20"], None);
    let cli = lan.host(&["10.78.0.2/20"], None);
    let p = start_plinth(&mut lan, &srv, &tmp.path().join("p"), &db.url, AUTH_SUBNET);

    let started = Instant::now();
    let r = perfdhcp(
        &lan,
        &cli,
        &[
            "-4",
            "-l",
            "10.78.0.2",
            "--scenario",
            "avalanche",
            "-R",
            &CLIENTS.to_string(),
            "-u",
            "-x",
            "l",
            "10.78.0.1",
        ],
        Duration::from_secs(45),
    );
    let took = started.elapsed();
    assert_eq!(r.exit, 0, "perfdhcp did not finish cleanly:\n{}", r.text);
    assert_eq!(
        r.acked.len(),
        CLIENTS,
        "every client was acknowledged ({took:?})"
    );
    assert_eq!(r.num("REQUEST-ACK", "non unique addresses"), 0.0);

    let rows = lease_rows(&db.url).await;
    let bound = bound_by_mac(&rows);
    assert_eq!(bound.len(), CLIENTS, "one bound lease per client");
    let ips: HashSet<Ipv4Addr> = bound.values().copied().collect();
    assert_eq!(ips.len(), CLIENTS, "no address given twice");
    // perfdhcp prints no client id for DHCPv4 leases: compare the addresses it was given.
    let acked: HashSet<Ipv4Addr> = r.acked.iter().map(|(_, ip)| *ip).collect();
    assert_eq!(acked, ips, "perfdhcp's addresses are the stored ones");
    let m = metrics(&lan, &p);
    let acks = m
        .get("plinth_dhcp_replies_total{kind=\"ack\"}")
        .copied()
        .unwrap_or(0.0);
    assert!(acks >= CLIENTS as f64, "metrics count the ACKs: {m:?}");
    let latency = describe_latency(&m);
    assert!(lan.alive(p.idx), "plinth still runs");
    eprintln!("perfdhcp: {CLIENTS} clients, DORA complete in {took:?}; {latency}");
    db.drop_db().await;
}

/// The DHCP path's instrumentation after a perfdhcp run, checked against what perfdhcp did: every
/// answer sent has its latency recorded (decided, sent), every ACK's commit too; the group commit
/// carried at least every ACK's lease in the transactions it counts (each one fsync on SQLite);
/// nothing is left in flight. Returns a one-line summary (means) for the test's output.
fn describe_latency(m: &std::collections::HashMap<String, f64>) -> String {
    let get = |k: &str| m.get(k).copied().unwrap_or(0.0);
    let stage = |s: &str, what: &str| {
        get(&format!(
            "plinth_dhcp_latency_seconds_{what}{{stage=\"{s}\"}}"
        ))
    };
    let acks = sample(m, "plinth_dhcp_replies_total", "kind", "ack");
    let answers = acks + sample(m, "plinth_dhcp_replies_total", "kind", "offer");
    assert!(
        stage("sent", "count") >= answers,
        "every answer sent is timed: {m:?}"
    );
    assert!(
        stage("decided", "count") >= answers,
        "every decision is timed: {m:?}"
    );
    assert!(
        stage("committed", "count") >= acks,
        "every ACK's commit is timed: {m:?}"
    );
    assert!(
        stage("decided", "sum") <= stage("sent", "sum"),
        "a request is decided before it is answered: {m:?}"
    );
    let writes = get("plinth_store_commit_writes_sum");
    let commits = get("plinth_store_commits_total");
    assert!(
        writes >= acks,
        "the group commit wrote every ACK's lease: {m:?}"
    );
    assert!(
        commits >= 1.0 && commits <= get("plinth_store_commit_writes_count"),
        "{m:?}"
    );
    assert_eq!(
        sample(m, "plinth_dhcp_in_flight", "class", "unknown"),
        0.0,
        "{m:?}"
    );
    assert_eq!(
        sample(m, "plinth_dhcp_in_flight", "class", "known"),
        0.0,
        "{m:?}"
    );
    let mean = |s: &str| 1000.0 * stage(s, "sum") / stage(s, "count").max(1.0);
    format!(
        "mean ms from arrival: decided {:.2}, committed {:.2}, sent {:.2}; {} transactions for {} writes ({:.1} per fsync)",
        mean("decided"),
        mean("committed"),
        mean("sent"),
        commits,
        writes,
        writes / commits.max(1.0)
    )
}

/// A subnet that is not on Plinth's link, reached through a relay: perfdhcp in the relay
/// namespace uses the relay's gateway address as giaddr and adds option 82; Plinth answers to
/// giaddr:67 (routed through the relay) and records circuit id, remote id and giaddr with the
/// lease. A hand-built relayed DISCOVER checks the reply fields themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_requests_are_answered_through_the_relay_with_option_82_recorded() {
    let tmp = tempfile::tempdir().expect("tmp");
    let db = TestDb::new(Backend::Sqlite).await;
    let mut lan = Lan::new("rl");
    let srv = lan.host(&["10.79.0.1/24"], None);
    let relay = lan.host(&["10.79.0.2/24"], None);
    // The relay's gateway address on the remote subnet. perfdhcp sends from the interface that
    // holds its -l address, so it sits on the relay's link to Plinth; Plinth still reaches it only
    // through the route via the relay.
    lan::ip(&[
        "-n",
        &relay.ns,
        "addr",
        "add",
        "10.80.0.1/24",
        "dev",
        &relay.ifname,
    ]);
    lan::ip(&[
        "-n",
        &srv.ns,
        "route",
        "add",
        "10.80.0.0/24",
        "via",
        "10.79.0.2",
    ]);
    let p = start_plinth(
        &mut lan,
        &srv,
        &tmp.path().join("p"),
        &db.url,
        r#"boot_url = "http://10.79.0.1:8080"
[[dhcp.subnet]]
cidr = "10.79.0.0/24"
server_ip = "10.79.0.1"
pool = ["10.79.0.100-10.79.0.200"]
[[dhcp.subnet]]
cidr = "10.80.0.0/24"
server_ip = "10.79.0.1"
pool = ["10.80.0.100-10.80.0.250"]
routers = ["10.80.0.1"]
lease_seconds = 600
# the relay host sends from either of its addresses (perfdhcp from its -l address, the agent
# below from its address on the link to Plinth)
relay_agents = ["10.80.0.1", "10.79.0.2"]
# perfdhcp puts all its hundred clients, unknown to the inventory, behind one switch port (one
# circuit id), in a pool of 151
leases_per_circuit = 1000
unknown_share = 1.0
"#,
    );
    // Option 82: circuit id "Gi1/0/7", remote id "sw-rack4".
    let circuit = b"Gi1/0/7";
    let remote = b"sw-rack4";
    let mut o82 = vec![1, circuit.len() as u8];
    o82.extend_from_slice(circuit);
    o82.extend_from_slice(&[2, remote.len() as u8]);
    o82.extend_from_slice(remote);
    let r = perfdhcp(
        &lan,
        &relay,
        &[
            "-4",
            "-l",
            "10.80.0.1",
            "-r",
            "50",
            "-n",
            "100",
            "-R",
            "100000",
            "-d",
            "2",
            "-W",
            "3000000",
            "-o",
            &format!("82,{}", hex::encode(&o82)),
            "-x",
            "l",
            "10.79.0.1",
        ],
        Duration::from_secs(20),
    );
    assert_eq!(r.exit, 0, "perfdhcp through the relay:\n{}", r.text);
    assert_eq!(r.num("REQUEST-ACK", "drops"), 0.0, "{}", r.text);
    assert!(r.acked.len() >= 95, "{}", r.text);
    for (_, ip) in &r.acked {
        assert_eq!(
            &ip.octets()[..3],
            &[10, 80, 0],
            "remote subnet address: {ip}"
        );
    }
    let rows = lease_rows(&db.url).await;
    let bound: Vec<_> = rows.iter().filter(|r| r.state == "bound").collect();
    assert!(bound.len() >= r.acked.len(), "{bound:?}");
    for l in &bound {
        assert_eq!(l.circuit.as_deref(), Some(hex::encode(circuit).as_str()));
        assert_eq!(l.remote.as_deref(), Some(hex::encode(remote).as_str()));
        assert_eq!(l.giaddr.as_deref(), Some("10.80.0.1"));
    }

    // A relayed DISCOVER built here: the OFFER goes to giaddr:67 with giaddr and option 82 echoed.
    let mut agent = Agent::start(&lan, &relay, 67);
    let mac = [0x52, 0x54, 0, 0x80, 0, 1];
    let mut m = pxe_message(
        &mac,
        0x0801_0001,
        MessageType::Discover,
        Ipv4Addr::UNSPECIFIED,
    );
    m.set_giaddr(Ipv4Addr::new(10, 80, 0, 1)).set_hops(1);
    m.opts_mut()
        .insert(DhcpOption::Unknown(v4::UnknownOption::new(
            OptionCode::RelayAgentInformation,
            o82.clone(),
        )));
    agent.send("10.79.0.1:67".parse().expect("addr"), &encode(&m));
    let got = collect(&mut agent, 0x0801_0001, Duration::from_secs(3));
    assert_eq!(got.len(), 1, "one OFFER through the relay: {got:?}");
    let (from, offer) = &got[0];
    assert_eq!(from.port(), 67, "server port");
    assert_eq!(msg_type(offer), Some(MessageType::Offer));
    assert_eq!(offer.giaddr(), Ipv4Addr::new(10, 80, 0, 1));
    assert_eq!(&offer.yiaddr().octets()[..3], &[10, 80, 0]);
    assert_eq!(server_id(offer), Some(Ipv4Addr::new(10, 79, 0, 1)));
    assert!(
        offer
            .opts()
            .get(OptionCode::RelayAgentInformation)
            .is_some(),
        "option 82 echoed (RFC 3046 section 2.2)"
    );
    let m = metrics(&lan, &p);
    assert!(sample(&m, "plinth_dhcp_replies_total", "kind", "ack") >= 95.0);
    drop(agent);
    db.drop_db().await;
}

/// dnsmasq owns the addresses; Plinth in proxy mode on the same link. A UEFI PXE client built
/// here gets dnsmasq's address offer and Plinth's proxy offer (no address, option 60 PXEClient, a
/// boot file), takes the address from dnsmasq (Plinth stays silent on that REQUEST), then asks
/// Plinth on port 4011 and gets the ACK with the boot file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_dhcp_next_to_dnsmasq() {
    let tmp = tempfile::tempdir().expect("tmp");
    let db = TestDb::new(Backend::Sqlite).await;
    let mut lan = Lan::new("px");
    let srv = lan.host(&["10.81.0.1/24"], None);
    let dns = lan.host(&["10.81.0.2/24"], None);
    let cli = lan.host(&[], Some("52:54:00:81:00:07"));
    let p = start_plinth(
        &mut lan,
        &srv,
        &tmp.path().join("p"),
        &db.url,
        r#"boot_url = "http://10.81.0.1:8080"
[[dhcp.subnet]]
cidr = "10.81.0.0/24"
mode = "proxy"
server_ip = "10.81.0.1"
"#,
    );
    let d = peers::dir_in(tmp.path(), "dnsmasq");
    let mut cmd = lan.cmd(&dns, "dnsmasq");
    cmd.args([
        "--no-daemon",
        "--conf-file=/dev/null",
        "--port=0",
        "--user=root",
        "--bind-interfaces",
        &format!("--interface={}", dns.ifname),
        "--dhcp-range=10.81.0.100,10.81.0.150,255.255.255.0,600",
        "--dhcp-authoritative",
        &format!("--dhcp-leasefile={}", d.join("leases").display()),
        &format!("--pid-file={}", d.join("pid").display()),
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    let dq = lan.spawn(cmd);
    lan::wait_for_line(
        lan.child(dq),
        "DHCP, sockets bound",
        Duration::from_secs(10),
    );

    let mac = mac_of(&lan, &cli);
    let mut agent = Agent::start(&lan, &cli, 68);
    let bcast: SocketAddr = "255.255.255.255:67".parse().expect("addr");
    let xid = 0x0081_0001;
    let mut offers = Vec::new();
    for _ in 0..3 {
        agent.send(
            bcast,
            &encode(&pxe_message(
                &mac,
                xid,
                MessageType::Discover,
                Ipv4Addr::UNSPECIFIED,
            )),
        );
        offers.extend(collect(&mut agent, xid, Duration::from_secs(2)));
        let dnsmasq_seen = offers.iter().any(|(_, o)| !o.yiaddr().is_unspecified());
        let plinth_seen = offers.iter().any(|(_, o)| o.yiaddr().is_unspecified());
        if dnsmasq_seen && plinth_seen {
            break;
        }
    }
    let (_, addr_offer) = offers
        .iter()
        .find(|(_, o)| server_id(o) == Some(Ipv4Addr::new(10, 81, 0, 2)))
        .unwrap_or_else(|| panic!("no offer from dnsmasq: {offers:?}"));
    assert_eq!(msg_type(addr_offer), Some(MessageType::Offer));
    let ip = addr_offer.yiaddr();
    assert_eq!(&ip.octets()[..3], &[10, 81, 0]);
    let (_, proxy_offer) = offers
        .iter()
        .find(|(_, o)| server_id(o) == Some(Ipv4Addr::new(10, 81, 0, 1)))
        .unwrap_or_else(|| panic!("no proxy offer from Plinth: {offers:?}"));
    assert_eq!(msg_type(proxy_offer), Some(MessageType::Offer));
    assert_eq!(
        proxy_offer.yiaddr(),
        Ipv4Addr::UNSPECIFIED,
        "proxy: no address"
    );
    assert_eq!(
        opt_bytes(proxy_offer, OptionCode::ClassIdentifier).as_deref(),
        Some(&b"PXEClient"[..]),
        "option 60 PXEClient"
    );
    assert_eq!(
        opt_bytes(proxy_offer, OptionCode::BootfileName).as_deref(),
        Some(&b"ipxe.efi"[..])
    );
    assert_eq!(proxy_offer.siaddr(), Ipv4Addr::new(10, 81, 0, 1));

    // Take the address from dnsmasq. Plinth must not answer this REQUEST.
    let xid2 = 0x0081_0002;
    let mut req = pxe_message(&mac, xid2, MessageType::Request, Ipv4Addr::UNSPECIFIED);
    req.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
    req.opts_mut()
        .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 81, 0, 2)));
    agent.send(bcast, &encode(&req));
    let acks = collect(&mut agent, xid2, Duration::from_secs(2));
    assert!(
        acks.iter()
            .any(|(_, a)| msg_type(a) == Some(MessageType::Ack)
                && a.yiaddr() == ip
                && server_id(a) == Some(Ipv4Addr::new(10, 81, 0, 2))),
        "dnsmasq ACKs {ip}: {acks:?}"
    );
    assert!(
        acks.iter()
            .all(|(_, a)| server_id(a) != Some(Ipv4Addr::new(10, 81, 0, 1))),
        "Plinth stays silent on a REQUEST for another server: {acks:?}"
    );

    // Configure the address, then ask the proxy on 4011 (PXE spec 2.2.6).
    lan::ip(&[
        "-n",
        &cli.ns,
        "addr",
        "add",
        &format!("{ip}/24"),
        "dev",
        &cli.ifname,
    ]);
    let xid3 = 0x0081_0003;
    let mut boot = pxe_message(&mac, xid3, MessageType::Request, ip);
    boot.set_flags(v4::Flags::default());
    let mut ack = Vec::new();
    for _ in 0..3 {
        agent.send("10.81.0.1:4011".parse().expect("addr"), &encode(&boot));
        ack = collect(&mut agent, xid3, Duration::from_secs(1));
        if !ack.is_empty() {
            break;
        }
    }
    assert_eq!(ack.len(), 1, "one ACK from the proxy: {ack:?}");
    let (from, ack) = &ack[0];
    assert_eq!(*from, "10.81.0.1:4011".parse::<SocketAddr>().expect("addr"));
    assert_eq!(msg_type(ack), Some(MessageType::Ack));
    assert_eq!(ack.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(
        opt_bytes(ack, OptionCode::BootfileName).as_deref(),
        Some(&b"ipxe.efi"[..])
    );
    assert_eq!(
        opt_bytes(ack, OptionCode::ClassIdentifier).as_deref(),
        Some(&b"PXEClient"[..])
    );
    // The address came from dnsmasq, and Plinth recorded no lease.
    let leases = std::fs::read_to_string(d.join("leases")).unwrap_or_default();
    assert!(leases.contains(&ip.to_string()), "dnsmasq leases: {leases}");
    assert!(lease_rows(&db.url).await.is_empty());
    let m = metrics(&lan, &p);
    assert!(sample(&m, "plinth_dhcp_dropped_total", "reason", "proxy_not_ours") >= 1.0);
    drop(agent);
    db.drop_db().await;
}

/// Hostile and broken packets sent to Plinth's socket: each is dropped and counted under its
/// reason on /metrics, a flood from one MAC is rate limited, and afterwards a good client still
/// gets its OFFER from the same (unpanicked) process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_over_the_wire_is_counted_and_survived() {
    let tmp = tempfile::tempdir().expect("tmp");
    let db = TestDb::new(Backend::Sqlite).await;
    let mut lan = Lan::new("bd");
    let srv = lan.host(&["10.83.0.1/24"], None);
    let cli = lan.host(&["10.83.0.2/24"], None);
    let p = start_plinth(
        &mut lan,
        &srv,
        &tmp.path().join("p"),
        &db.url,
        r#"boot_url = "http://10.83.0.1:8080"
[[dhcp.subnet]]
cidr = "10.83.0.0/24"
server_ip = "10.83.0.1"
pool = ["10.83.0.100-10.83.0.200"]
"#,
    );
    let mut agent = Agent::start(&lan, &cli, 68);
    let to: SocketAddr = "10.83.0.1:67".parse().expect("addr");
    let good = |mac_last: u8, xid: u32| {
        encode(&pxe_message(
            &[0x52, 0x54, 0, 0x83, 0, mac_last],
            xid,
            MessageType::Discover,
            Ipv4Addr::UNSPECIFIED,
        ))
    };
    let base = good(1, 1);
    let opts_end = base.len() - 1; // the END option
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    cases.push(("truncated", base[..120].to_vec()));
    cases.push(("truncated", Vec::new()));
    cases.push(("truncated", base[..239].to_vec()));
    let mut overlong = base[..opts_end].to_vec();
    overlong.extend_from_slice(&[12, 200, b'x', b'y']);
    cases.push(("bad_option_length", overlong));
    let mut bad_type_len = base[..opts_end].to_vec();
    bad_type_len.extend_from_slice(&[57, 1, 5, 255]);
    cases.push(("bad_option_length", bad_type_len));
    let mut bad93 = base[..opts_end].to_vec();
    bad93.extend_from_slice(&[93, 3, 0, 7, 1, 255]);
    cases.push(("bad_option_length", bad93));
    let mut bootp = base[..240].to_vec();
    bootp.push(255);
    bootp.resize(300, 0); // a BOOTP request: cookie, no option 53
    cases.push(("bootp_unsupported", bootp));
    let mut hops = base.clone();
    hops[3] = 255;
    cases.push(("too_many_hops", hops));
    let mut reply = base.clone();
    reply[0] = 2;
    cases.push(("not_a_request", reply));
    let mut htype = base.clone();
    htype[1] = 6; // IEEE 802
    cases.push(("not_ethernet", htype));
    let mut offer = pxe_message(
        &[0x52, 0x54, 0, 0x83, 0, 9],
        9,
        MessageType::Offer,
        Ipv4Addr::UNSPECIFIED,
    );
    offer.set_opcode(v4::Opcode::BootRequest);
    cases.push(("unexpected_message_type", encode(&offer)));

    let before = metrics(&lan, &p);
    let mut expected: std::collections::HashMap<&str, f64> = Default::default();
    for (reason, bytes) in &cases {
        agent.send(to, bytes);
        *expected.entry(reason).or_default() += 1.0;
    }
    // A flood from one MAC: far above the per-MAC budget.
    let flood = good(0x66, 0x6666);
    for _ in 0..300 {
        agent.send(to, &flood);
    }
    // Drain whatever the flood's few allowed DISCOVERs earned.
    let _ = collect(&mut agent, 0, Duration::from_millis(500));

    // The server still answers a good client.
    let xid = 0x0083_0077;
    let mut got = Vec::new();
    for _ in 0..3 {
        agent.send(to, &good(0x77, xid));
        got = collect(&mut agent, xid, Duration::from_secs(1));
        if !got.is_empty() {
            break;
        }
    }
    assert!(
        got.iter()
            .any(|(_, o)| msg_type(o) == Some(MessageType::Offer)
                && o.yiaddr().octets()[..3] == [10, 83, 0]),
        "a good client is still answered: {got:?}"
    );

    let after = metrics(&lan, &p);
    let dropped = |m: &std::collections::HashMap<String, f64>, r: &str| {
        sample(m, "plinth_dhcp_dropped_total", "reason", r)
    };
    for (reason, n) in &expected {
        assert_eq!(
            dropped(&after, reason) - dropped(&before, reason),
            *n,
            "plinth_dhcp_dropped_total{{reason=\"{reason}\"}}: {after:?}"
        );
    }
    let limited = dropped(&after, "rate_limited") + dropped(&after, "overload");
    assert!(
        limited >= 200.0,
        "the flood is rate limited: {limited} of 300 dropped; {after:?}"
    );
    assert!(lan.alive(p.idx), "plinth still runs");
    drop(agent);
    db.drop_db().await;
}

/// Two Plinth processes on one PostgreSQL database serve the same subnet on one link; two
/// perfdhcp clients (one per server, distinct MACs, 1000 each: more than half the pool) load them
/// at once, so both allocate from the same pool concurrently. Each client's scan starts at a hash
/// of its MAC, so the instances rarely reach for one address, and when they do the database's
/// conditional upsert decides. No address goes to two MACs: every client completes, no address is
/// acknowledged by both instances, and the lease table holds exactly one bound lease per client
/// (no MAC with two) on distinct addresses, the ones perfdhcp was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_postgres_never_share_an_address() {
    const PER_CLIENT: usize = 1000;
    let tmp = tempfile::tempdir().expect("tmp");
    let db = TestDb::new(Backend::Postgres).await;
    // Migrate once so the two instances do not race on the schema.
    plinth::store::open(&plinth::store::StoreOptions {
        url: db.url.clone(),
        max_connections: 1,
        migrate: true,
    })
    .await
    .expect("migrate");
    let mut lan = Lan::new("pg");
    // The database listens where the test can reach it; forward it onto the segment.
    lan.uplink("10.84.15.1/20");
    let (fwd, fwd_task) = lan::tcp_forward(Ipv4Addr::new(10, 84, 15, 1), {
        let (_, upstream) = lan::rehost_url(&db.url, "0.0.0.0:0".parse().expect("addr"));
        upstream
    })
    .await;
    let (db_url, _) = lan::rehost_url(&db.url, fwd);
    let a = lan.host(&["10.84.0.1/20"], None);
    let b = lan.host(&["10.84.0.2/20"], None);
    let ca = lan.host(&["10.84.0.10/20"], None);
    let cb = lan.host(&["10.84.0.11/20"], None);
    let subnet = |server: &str| {
        format!(
            "boot_url = \"http://{server}:8080\"\n[[dhcp.subnet]]\ncidr = \"10.84.0.0/20\"\n\
             server_ip = \"{server}\"\npool = [\"10.84.1.0-10.84.14.254\"]\nlease_seconds = 3600\n"
        )
    };
    let pa = start_plinth(
        &mut lan,
        &a,
        &tmp.path().join("a"),
        &db_url,
        &subnet("10.84.0.1"),
    );
    // Instances sharing a database share its secret key (a different one is refused at start).
    std::fs::create_dir_all(tmp.path().join("b")).expect("dir b");
    std::fs::copy(
        tmp.path().join("a").join("secret.key"),
        tmp.path().join("b").join("secret.key"),
    )
    .expect("share the key");
    let pb = start_plinth(
        &mut lan,
        &b,
        &tmp.path().join("b"),
        &db_url,
        &subnet("10.84.0.2"),
    );
    let run = |host: lan::Host, local: &'static str, server: &'static str, base: &'static str| {
        let ns = host.ns.clone();
        std::thread::spawn(move || {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &ns, "timeout", "--signal=INT", "50"])
                .args([
                    "/usr/sbin/perfdhcp",
                    "-4",
                    "-l",
                    local,
                    "--scenario",
                    "avalanche",
                    "-R",
                    &PER_CLIENT.to_string(),
                    "-b",
                    base,
                    "-u",
                    "-x",
                    "l",
                    server,
                ])
                .output()
                .expect("perfdhcp");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            peers::parse_perfdhcp(&text, out.status.code().unwrap_or(-1))
        })
    };
    let ta = run(ca, "10.84.0.10", "10.84.0.1", "mac=00:0a:00:00:00:00");
    let tb = run(cb, "10.84.0.11", "10.84.0.2", "mac=00:0b:00:00:00:00");
    let ra = ta.join().expect("perfdhcp a");
    let rb = tb.join().expect("perfdhcp b");
    let (ma, mb) = (metrics(&lan, &pa), metrics(&lan, &pb));
    for (r, m) in [(&ra, &ma), (&rb, &mb)] {
        let summary = r.text.split("***Leases").next().unwrap_or("");
        assert_eq!(r.exit, 0, "{summary}\nplinth: {m:?}");
        assert_eq!(r.acked.len(), PER_CLIENT, "{summary}\nplinth: {m:?}");
    }
    // What each perfdhcp was given: no address acknowledged by both servers.
    let got_a: HashSet<Ipv4Addr> = ra.acked.iter().map(|(_, ip)| *ip).collect();
    let got_b: HashSet<Ipv4Addr> = rb.acked.iter().map(|(_, ip)| *ip).collect();
    assert_eq!(got_a.len() + got_b.len(), 2 * PER_CLIENT);
    let both: Vec<_> = got_a.intersection(&got_b).collect();
    assert!(both.is_empty(), "acknowledged by both instances: {both:?}");
    let rows = lease_rows(&db.url).await;
    let bound = bound_by_mac(&rows);
    let bound_ips: HashSet<Ipv4Addr> = bound.values().copied().collect();
    let missing: Vec<_> = rows
        .iter()
        .filter(|r| (got_a.contains(&r.ip) || got_b.contains(&r.ip)) && !bound_ips.contains(&r.ip))
        .collect();
    let per_mac: Vec<_> = missing
        .iter()
        .map(|m| rows.iter().filter(|r| r.mac == m.mac).collect::<Vec<_>>())
        .collect();
    assert_eq!(
        bound.len(),
        2 * PER_CLIENT,
        "one bound lease per client; acknowledged but not bound: {per_mac:?}"
    );
    let ips: HashSet<Ipv4Addr> = bound.values().copied().collect();
    assert_eq!(ips.len(), 2 * PER_CLIENT, "no address given twice");
    let given: HashSet<Ipv4Addr> = got_a.union(&got_b).copied().collect();
    assert_eq!(given, ips, "the stored leases are the acknowledged ones");
    let macs: HashSet<&str> = bound.keys().map(|m| &m[..5]).collect();
    assert_eq!(
        macs,
        HashSet::from(["00:0a", "00:0b"]),
        "both clients' MACs hold leases"
    );
    for (name, m) in [("a", &ma), ("b", &mb)] {
        assert!(sample(m, "plinth_dhcp_replies_total", "kind", "ack") >= PER_CLIENT as f64);
        // On a shared database every offer is committed too.
        let offers = sample(m, "plinth_dhcp_replies_total", "kind", "offer");
        let committed = m
            .get("plinth_dhcp_latency_seconds_count{stage=\"committed\"}")
            .copied()
            .unwrap_or(0.0);
        assert!(committed >= offers + PER_CLIENT as f64, "{m:?}");
        eprintln!("instance {name}: {}", describe_latency(m));
    }
    lan.stop_all();
    fwd_task.abort();
    db.drop_db().await;
}

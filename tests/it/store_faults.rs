//! A store fault is a fault, never "not found": a server running over a store that fails
//! (`support::broken_store`, wired in through `app::spawn_with_stores`) answers the HTTP API with a
//! 5xx and the error envelope (never a 404, never the internal error text), the boot routes with a
//! 503 (iPXE and Talos retry), `/healthz` with a 503, and DHCP with silence, counted by reason in
//! `/metrics`, and TFTP with an error packet that says "try again" rather than "no such file".
//! Over real sockets.

use crate::support;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use dhcproto::v4::{self, DhcpOption, MessageType};
use dhcproto::{Decodable, Decoder, Encodable};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use support::broken_store::{BrokenStore, Port};
use support::{Ask as _, Backend, TestServer};

/// The answer to one request: status and body.
async fn ask(
    s: &TestServer,
    method: Method,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, String) {
    let mut r = s.client.request(method.clone(), s.url(path));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if method == Method::POST {
        r = r.json(&json!({ "hostname": "new-node" }));
    }
    let r = r.answer().await;
    (r.status, r.text)
}

/// A store fault as the API answers it: a 5xx with the error envelope, without the fault's text.
fn assert_fault(what: &str, (status, body): &(StatusCode, String)) {
    assert!(status.is_server_error(), "{what}: {status} {body}");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
    assert_eq!(v["error"]["code"], "internal", "{what}: {body}");
    assert!(
        !body.contains("broken store"),
        "{what}: the fault's text leaked: {body}"
    );
}

/// A server whose store fails on every call from the start: every API route a 5xx at
/// authentication already, the boot routes 503, `/healthz` 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_store_is_a_5xx_never_a_404() {
    let s = TestServer::start_over(Backend::Sqlite, "", |_| {
        plinth::service::Stores::of(BrokenStore::dead())
    })
    .await;
    let id = plinth::domain::MachineId::new();
    let admin = s.admin.clone();
    for (method, path) in [
        (Method::GET, "/api/v1/machines".to_string()),
        (Method::GET, format!("/api/v1/machines/{id}")),
        (Method::POST, "/api/v1/machines".to_string()),
        (Method::GET, "/api/v1/events".to_string()),
        (Method::GET, "/api/v1/tokens".to_string()),
    ] {
        let what = format!("{method} {path}");
        assert_fault(&what, &ask(&s, method, &path, Some(&admin)).await);
    }
    let (status, body) = ask(&s, Method::GET, "/healthz", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("database unreachable"), "{body}");
    let (status, body) = ask(
        &s,
        Method::GET,
        "/boot/machine.ipxe?mac=52-54-00-f0-00-01&buildarch=x86_64",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.starts_with("#!ipxe"), "{body}");
    let (status, body) = ask(
        &s,
        Method::GET,
        &format!("/config/{id}?token=t&uuid=u"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    s.finish().await;
}

/// A server whose store breaks while it runs, one port at a time: the routes that need the
/// broken port answer 5xx (the machine that exists is never a 404), the others still answer;
/// healed, everything answers again.
async fn a_store_that_breaks_mid_way(b: Backend) {
    let mut handle = None;
    let s = TestServer::start_over(b, "", |real| {
        let broken = BrokenStore::over(real);
        handle = Some(broken.clone());
        plinth::service::Stores::of(broken)
    })
    .await;
    let broken: Arc<BrokenStore> = handle.expect("store");
    let mac = "52:54:00:f0:00:02";
    let r = s
        .req(Method::POST, "/api/v1/machines", &s.operator)
        .json(&json!({
            "hostname": "faulty",
            "interfaces": [{ "mac": mac, "boot": true }],
        }))
        .answer()
        .await
        .expect_status(StatusCode::CREATED);
    let id = r.json()["id"].as_str().expect("id").to_string();
    let viewer = s.viewer.clone();
    let reads = [
        format!("/api/v1/machines/{id}"),
        "/api/v1/machines/faulty".to_string(),
        format!("/api/v1/machines/lookup?mac={mac}"),
        "/api/v1/machines?q=faulty".to_string(),
        format!("/api/v1/machines/{id}/config"),
        format!("/api/v1/events?machine={id}"),
    ];
    let boot = format!(
        "/boot/machine.ipxe?mac={}&buildarch=x86_64",
        mac.replace(':', "-")
    );
    for path in &reads {
        let (status, body) = ask(&s, Method::GET, path, Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "healthy: {path}: {body}");
    }
    assert_eq!(ask(&s, Method::GET, &boot, None).await.0, StatusCode::OK);

    // Machines down: every read of a machine is a fault, not "no such machine".
    broken.break_port(Port::Machines);
    for path in &reads[..4] {
        assert_fault(path, &ask(&s, Method::GET, path, Some(&viewer)).await);
    }
    let (status, body) = ask(&s, Method::GET, &boot, None).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "boot of a known MAC: {body}"
    );
    let unknown = "/boot/machine.ipxe?mac=52-54-00-f0-00-03&buildarch=x86_64";
    let (status, body) = ask(&s, Method::GET, unknown, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "discovery: {body}");
    let (status, _) = ask(&s, Method::GET, "/healthz", None).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the database's health is its own port"
    );
    broken.heal();

    // Configs down: the config status and a config fetch are faults.
    broken.break_port(Port::Configs);
    assert_fault(
        &reads[4],
        &ask(&s, Method::GET, &reads[4], Some(&viewer)).await,
    );
    let (status, _) = ask(&s, Method::GET, &format!("/config/{id}?token=t"), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "config fetch");
    broken.heal();

    // Events down: the event log is a fault; tokens down: authentication is a fault, not a 401.
    broken.break_port(Port::Events);
    assert_fault(
        &reads[5],
        &ask(&s, Method::GET, &reads[5], Some(&viewer)).await,
    );
    broken.heal();
    broken.break_port(Port::Tokens);
    assert_fault(
        "auth",
        &ask(&s, Method::GET, &reads[0], Some(&viewer)).await,
    );
    broken.heal();
    broken.break_port(Port::Health);
    assert_eq!(
        ask(&s, Method::GET, "/healthz", None).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );

    broken.heal();
    for path in &reads {
        let (status, body) = ask(&s, Method::GET, path, Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "healed: {path}: {body}");
    }
    assert_eq!(ask(&s, Method::GET, &boot, None).await.0, StatusCode::OK);
    assert_eq!(
        ask(&s, Method::GET, "/healthz", None).await.0,
        StatusCode::OK
    );
    s.finish().await;
}

both_backends!(a_store_that_breaks_mid_way);

/// A relayed DISCOVER (giaddr set, RFC 2131 section 4.1) from `mac`.
fn discover(relay: Ipv4Addr, mac: [u8; 6], xid: u32) -> Vec<u8> {
    let mut m = v4::Message::new(
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        relay,
        &mac,
    );
    m.set_xid(xid).set_hops(1);
    m.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Discover));
    m.to_vec().expect("encode")
}

/// `plinth_dhcp_dropped_total{reason="..."}` as `/metrics` reports it (0 when absent).
async fn dropped(s: &TestServer, reason: &str) -> u64 {
    metric(
        s,
        &format!("plinth_dhcp_dropped_total{{reason=\"{reason}\"}}"),
    )
    .await as u64
}

/// A server doing DHCP over a `BrokenStore` on a free port of every address, and the test as its
/// relay agent: a socket on port 67 of an address of a loopback network of its own, where the
/// server's answers land. Returns the server, the store's handle, the relay's socket, the server's
/// address and the relay's.
async fn dhcp_over_broken_store() -> (
    TestServer,
    Arc<BrokenStore>,
    tokio::net::UdpSocket,
    SocketAddr,
    Ipv4Addr,
) {
    let port = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.local_addr())
        .expect("free port")
        .port();
    let net = uuid::Uuid::new_v4().as_bytes()[..2].to_vec();
    let (a, b) = (100 + net[0] % 150, net[1]);
    let relay = Ipv4Addr::new(127, a, b, 1);
    let toml = format!(
        "\n[dhcp]\nenabled = true\nport = {port}\nproxy_port = 0\nboot_url = \"http://127.0.0.1:8080\"\n\
         [[dhcp.subnet]]\ncidr = \"127.{a}.{b}.0/24\"\nmode = \"authoritative\"\nserver_ip = \"192.0.2.1\"\n\
         pool = [\"127.{a}.{b}.100-127.{a}.{b}.150\"]\nlease_seconds = 600\nrelay_agents = [\"127.{a}.{b}.1\"]\n"
    );
    let mut handle = None;
    let s = TestServer::start_over(Backend::Sqlite, &toml, |real| {
        let broken = BrokenStore::over(real);
        handle = Some(broken.clone());
        plinth::service::Stores::of(broken)
    })
    .await;
    let broken: Arc<BrokenStore> = handle.expect("store");
    let agent = tokio::net::UdpSocket::bind(SocketAddr::from((relay, 67)))
        .await
        .expect("bind the relay's port 67 (needs root, like the other DHCP tests)");
    let server = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    (s, broken, agent, server, relay)
}

/// DHCP over a store whose lease port breaks: a DISCOVER answered while it is healthy gets no
/// answer while it is broken, the drop counted as `store_error`; healed, DISCOVERs are answered
/// again. The server listens on a free port on every address; the test is the relay, on an address
/// of the loopback network of its own, where the server's answers (to the relay's port 67) land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dhcp_is_silent_on_a_store_fault_and_counts_the_drop() {
    let (s, broken, agent, server, relay) = dhcp_over_broken_store().await;
    let answer = |xid: u32| {
        let agent = &agent;
        async move {
            let mut buf = vec![0u8; 1500];
            loop {
                let n = tokio::time::timeout(Duration::from_secs(30), agent.recv(&mut buf))
                    .await
                    .expect("an answer")
                    .expect("recv");
                let m = v4::Message::decode(&mut Decoder::new(&buf[..n])).expect("decode");
                if m.xid() == xid {
                    return m;
                }
            }
        }
    };
    let kind = |m: &v4::Message| match m.opts().get(v4::OptionCode::MessageType) {
        Some(DhcpOption::MessageType(t)) => Some(*t),
        _ => None,
    };

    agent
        .send_to(
            &discover(relay, [0x52, 0x54, 0, 0xf1, 0, 1], 0x5101),
            server,
        )
        .await
        .expect("send");
    let offer = answer(0x5101).await;
    assert_eq!(kind(&offer), Some(MessageType::Offer));
    assert_eq!(dropped(&s, "store_error").await, 0);

    broken.break_port(Port::Leases);
    agent
        .send_to(
            &discover(relay, [0x52, 0x54, 0, 0xf1, 0, 2], 0x5102),
            server,
        )
        .await
        .expect("send");
    // The drop is counted once the decision failed, and then nothing is sent for it.
    let mut waited = 0;
    while dropped(&s, "store_error").await == 0 {
        waited += 1;
        assert!(waited < 600, "the store fault was never counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dropped(&s, "store_error").await, 1);
    let mut buf = [0u8; 1500];
    match agent.try_recv(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("an answer to a DISCOVER the store could not decide: {other:?}"),
    }

    broken.heal();
    agent
        .send_to(
            &discover(relay, [0x52, 0x54, 0, 0xf1, 0, 2], 0x5103),
            server,
        )
        .await
        .expect("send");
    assert_eq!(kind(&answer(0x5103).await), Some(MessageType::Offer));
    assert_eq!(dropped(&s, "store_error").await, 1);
    s.finish().await;
}

/// A sample of `/metrics` by its full name with labels (0 when absent).
async fn metric(s: &TestServer, name: &str) -> f64 {
    let (_, text) = ask(s, Method::GET, "/metrics", None).await;
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// DHCP over a lease store that stops answering (a stalled database): the server is not stuck.
/// Each request waits for its decision at most the firmware's retransmission time, then is
/// dropped and counted as `decision_timeout`; the in-flight gauge goes back to zero; `/metrics`
/// keeps answering; healed, DISCOVERs are answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dhcp_over_a_stalled_store_times_out_counts_and_recovers() {
    let (s, broken, agent, server, relay) = dhcp_over_broken_store().await;

    broken.stall_leases();
    for i in 0..3u8 {
        agent
            .send_to(
                &discover(relay, [0x52, 0x54, 0, 0xf2, 0, i], 0x5200 + u32::from(i)),
                server,
            )
            .await
            .expect("send");
    }
    let mut waited = 0;
    while dropped(&s, "decision_timeout").await < 3 {
        waited += 1;
        assert!(waited < 600, "the stalled decisions were never given up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dropped(&s, "decision_timeout").await, 3);
    assert_eq!(
        metric(&s, "plinth_dhcp_in_flight{class=\"unknown\"}").await,
        0.0,
        "the stalled requests' in-flight places are free again"
    );
    let mut buf = [0u8; 1500];
    match agent.try_recv(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("an answer to a DISCOVER the store never decided: {other:?}"),
    }

    broken.heal();
    agent
        .send_to(
            &discover(relay, [0x52, 0x54, 0, 0xf2, 0, 9], 0x5209),
            server,
        )
        .await
        .expect("send");
    let mut buf = vec![0u8; 1500];
    let answer = loop {
        let n = tokio::time::timeout(Duration::from_secs(30), agent.recv(&mut buf))
            .await
            .expect("an answer once healed")
            .expect("recv");
        let m = v4::Message::decode(&mut Decoder::new(&buf[..n])).expect("decode");
        if m.xid() == 0x5209 {
            break m;
        }
    };
    assert_eq!(
        answer.opts().get(v4::OptionCode::MessageType),
        Some(&DhcpOption::MessageType(MessageType::Offer))
    );
    // The server records an answer's latency once its send returns, which can be after the agent
    // has the datagram: read until it shows, a bounded number of times.
    let mut recorded = 0.0;
    for _ in 0..50 {
        recorded = metric(&s, "plinth_dhcp_latency_seconds_count{stage=\"sent\"}").await;
        if recorded >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recorded >= 1.0, "the answer's latency is recorded");
    s.finish().await;
}

/// TFTP asks the provisioning service which file a read request gets and whose machine it is for;
/// while the store cannot tell, the answer is a TFTP error packet with code 0 ("not defined": try
/// again), never code 1 ("file not found"); healed, the file is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tftp_answers_an_error_packet_on_a_store_fault_never_file_not_found() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("ipxe.efi"), b"an iPXE binary").expect("file");
    let toml = format!(
        "\n[boot]\nipxe_dir = \"{}\"\n[tftp]\nenabled = true\nlisten = \"127.0.0.1:0\"\n",
        dir.path().display()
    );
    let mut handle = None;
    let s = TestServer::start_over(Backend::Sqlite, &toml, |real| {
        let broken = BrokenStore::over(real);
        handle = Some(broken.clone());
        plinth::service::Stores::of(broken)
    })
    .await;
    let broken: Arc<BrokenStore> = handle.expect("store");
    let server = s.tftp_addr.expect("tftp on");
    // An RRQ (RFC 1350 section 5) from a client port of its own on `from` (each step from another
    // loopback address: the service remembers who an address is for a few seconds); the first
    // answer back.
    let read = |file: &'static str, from: &'static str| async move {
        let sock = tokio::net::UdpSocket::bind(format!("{from}:0"))
            .await
            .expect("bind");
        let mut rrq = vec![0, 1];
        rrq.extend_from_slice(file.as_bytes());
        rrq.extend_from_slice(b"\0octet\0");
        sock.send_to(&rrq, server).await.expect("send");
        let mut buf = vec![0u8; 600];
        let (n, _) = tokio::time::timeout(Duration::from_secs(10), sock.recv_from(&mut buf))
            .await
            .expect("an answer")
            .expect("recv");
        buf.truncate(n);
        buf
    };
    let data = read("ipxe.efi", "127.0.0.1").await;
    assert_eq!(&data[..4], &[0, 3, 0, 1], "DATA block 1 while healthy");
    assert_eq!(&data[4..], b"an iPXE binary");

    broken.break_port(Port::Leases);
    let err = read("ipxe.efi", "127.0.0.2").await;
    assert_eq!(
        &err[..4],
        &[0, 5, 0, 0],
        "ERROR code 0 on a store fault, not code 1: {err:?}"
    );
    broken.heal();
    // The fault is not remembered as "no machine at this address".
    let data = read("ipxe.efi", "127.0.0.2").await;
    assert_eq!(&data[..4], &[0, 3, 0, 1], "served again once healed");
    s.finish().await;
}

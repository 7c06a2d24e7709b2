//! DHCP decisions against the real stores (SQLite and PostgreSQL): RFC 2131 request handling, NAKs,
//! release and decline, relays with option 82, proxyDHCP, and two instances allocating from one
//! PostgreSQL pool under contention without giving an address twice.

use crate::support;

use std::net::Ipv4Addr;
use std::sync::Arc;

use plinth::domain::dhcp::{Arch, BootClient, BootFiles, Ipv4Range, Subnet, SubnetMode};
use plinth::domain::MacAddr;
use plinth::service::provisioning::dhcp::{
    DhcpRequest, DhcpService, LeaseTiming, Outcome, ReplyKind, RequestKind,
};
use plinth::service::{LeaseState, Stores};
use support::{Backend, TestDb};

fn subnet(net: &str, server: &str, pool: &str, mode: SubnetMode) -> Subnet {
    Subnet {
        net: net.parse().expect("net"),
        mode,
        server_ip: server.parse().expect("ip"),
        pool: if pool.is_empty() {
            vec![]
        } else {
            vec![pool.parse::<Ipv4Range>().expect("range")]
        },
        routers: vec![server.parse().expect("ip")],
        dns: vec![],
        ntp: vec![],
        domain: None,
        lease_seconds: 600,
        relay_agents: vec![RELAY.parse().expect("ip")],
        unknown_permille: 500,
        leases_per_circuit: 4,
        router_advert: None,
    }
}

/// The relay agent the test subnets trust.
const RELAY: &str = "10.20.0.254";

fn req(kind: RequestKind, mac: &str) -> DhcpRequest {
    DhcpRequest {
        kind,
        mac: mac.parse().expect("mac"),
        ciaddr: Ipv4Addr::UNSPECIFIED,
        giaddr: Ipv4Addr::UNSPECIFIED,
        requested_ip: None,
        server_id: None,
        client: BootClient::BiosPxe,
        hostname: None,
        circuit_id: None,
        remote_id: None,
        proxy_port: false,
        local_ips: vec!["10.20.0.1".parse().expect("ip")],
        interface: None,
        source: Ipv4Addr::UNSPECIFIED,
        known: true,
    }
}

fn service(store: Stores) -> DhcpService {
    DhcpService::new(
        store.leases,
        vec![
            subnet(
                "10.20.0.0/24",
                "10.20.0.1",
                "10.20.0.100-10.20.0.109",
                SubnetMode::Authoritative,
            ),
            subnet(
                "10.30.0.0/24",
                "10.20.0.1",
                "10.30.0.10-10.30.0.20",
                SubnetMode::Authoritative,
            ),
            subnet("10.40.0.0/24", "10.40.0.1", "", SubnetMode::Proxy),
        ],
        BootFiles {
            http_base: "http://10.20.0.1:8080".into(),
        },
        LeaseTiming::default(),
    )
}

fn reply(o: Outcome) -> plinth::service::provisioning::dhcp::DhcpReply {
    match o {
        Outcome::Reply(r) => r,
        Outcome::Silent(why) => panic!("no answer: {why}"),
    }
}

async fn dora(svc: &DhcpService, mac: &str) -> Ipv4Addr {
    let offer = reply(
        svc.handle(&req(RequestKind::Discover, mac))
            .await
            .expect("discover"),
    );
    assert_eq!(offer.kind, ReplyKind::Offer);
    let mut r = req(RequestKind::Request, mac);
    r.requested_ip = Some(offer.yiaddr);
    r.server_id = Some(offer.server_ip);
    let ack = reply(svc.handle(&r).await.expect("request"));
    assert_eq!(ack.kind, ReplyKind::Ack, "{ack:?}");
    assert_eq!(ack.yiaddr, offer.yiaddr);
    ack.yiaddr
}

async fn rfc2131_request_rules(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let svc = service(st.clone());
    let a = dora(&svc, "52:54:00:20:00:01").await;
    assert!(svc.subnets()[0].in_pool(a), "{a}");
    // A late or repeated DISCOVER from a bound client is offered its address and does not
    // downgrade the acknowledged lease.
    let again = reply(
        svc.handle(&req(RequestKind::Discover, "52:54:00:20:00:01"))
            .await
            .expect("discover"),
    );
    assert_eq!(again.yiaddr, a);
    let l = st.leases.lease_by_ip(a).await.expect("lease").expect("row");
    assert_eq!(l.state, LeaseState::Bound, "still bound");
    assert!(
        l.expires_ms > chrono::Utc::now().timestamp_millis() + 500_000,
        "expiry kept"
    );
    // The same client again gets the same address.
    assert_eq!(dora(&svc, "52:54:00:20:00:01").await, a);

    // INIT-REBOOT for an address on another network: NAK (RFC 2131 section 4.3.2).
    let mut r = req(RequestKind::Request, "52:54:00:20:00:01");
    r.requested_ip = Some("192.168.9.9".parse().expect("ip"));
    let nak = reply(svc.handle(&r).await.expect("request"));
    assert_eq!(nak.kind, ReplyKind::Nak);
    // Another MAC asking for a bound address: NAK.
    let mut r = req(RequestKind::Request, "52:54:00:20:00:02");
    r.requested_ip = Some(a);
    assert_eq!(
        reply(svc.handle(&r).await.expect("request")).kind,
        ReplyKind::Nak
    );
    // Outside the pool: NAK.
    r.requested_ip = Some("10.20.0.5".parse().expect("ip"));
    assert_eq!(
        reply(svc.handle(&r).await.expect("request")).kind,
        ReplyKind::Nak
    );
    // SELECTING another server's offer: silent, and our offer is freed.
    let offer = reply(
        svc.handle(&req(RequestKind::Discover, "52:54:00:20:00:03"))
            .await
            .expect("discover"),
    );
    // Another client asking for the address on offer to 03 (INIT-REBOOT, no server id): NAK,
    // whether the offer is a row (shared PostgreSQL) or held in memory (SQLite).
    let mut other = req(RequestKind::Request, "52:54:00:20:00:05");
    other.requested_ip = Some(offer.yiaddr);
    assert_eq!(
        reply(svc.handle(&other).await.expect("request")).kind,
        ReplyKind::Nak
    );
    let mut r = req(RequestKind::Request, "52:54:00:20:00:03");
    r.requested_ip = Some("10.20.0.200".parse().expect("ip"));
    r.server_id = Some("10.20.0.254".parse().expect("ip"));
    assert_eq!(
        svc.handle(&r).await.expect("request"),
        Outcome::Silent("chose_other_server")
    );
    // The offer was held in memory (SQLite) or recorded and now expired (shared PostgreSQL).
    let l = st.leases.lease_by_ip(offer.yiaddr).await.expect("lease");
    assert!(
        l.as_ref().is_none_or(|l| l.state == LeaseState::Expired),
        "{l:?}"
    );
    // RENEWING: ciaddr set, unicast answer, lease extended.
    let mut r = req(RequestKind::Request, "52:54:00:20:00:01");
    r.ciaddr = a;
    let ack = reply(svc.handle(&r).await.expect("renew"));
    assert_eq!((ack.kind, ack.yiaddr), (ReplyKind::Ack, a));
    // RELEASE frees the address, only from the address itself (a spoofed RELEASE from another
    // address, or a broadcast one, frees nothing); DECLINE quarantines one.
    let mut r = req(RequestKind::Release, "52:54:00:20:00:01");
    r.ciaddr = a;
    for spoofed in ["10.20.0.66", "0.0.0.0"] {
        r.source = spoofed.parse().expect("ip");
        assert_eq!(
            svc.handle(&r).await.expect("release"),
            Outcome::Silent("release_not_from_lease_address")
        );
        assert_eq!(
            st.leases
                .lease_by_ip(a)
                .await
                .expect("l")
                .expect("row")
                .state,
            LeaseState::Bound
        );
    }
    r.source = a;
    assert_eq!(
        svc.handle(&r).await.expect("release"),
        Outcome::Silent("released")
    );
    assert_eq!(
        st.leases
            .lease_by_ip(a)
            .await
            .expect("l")
            .expect("row")
            .state,
        LeaseState::Released
    );
    let b_ip = dora(&svc, "52:54:00:20:00:04").await;
    // Only the lease's own MAC declines it.
    let mut r = req(RequestKind::Decline, "52:54:00:20:00:05");
    r.requested_ip = Some(b_ip);
    assert_eq!(
        svc.handle(&r).await.expect("decline"),
        Outcome::Silent("decline_not_of_a_fresh_lease")
    );
    let mut r = req(RequestKind::Decline, "52:54:00:20:00:04");
    r.requested_ip = Some(b_ip);
    assert_eq!(
        svc.handle(&r).await.expect("decline"),
        Outcome::Silent("declined")
    );
    let l = st.leases.lease_by_ip(b_ip).await.expect("l").expect("row");
    assert_eq!(l.state, LeaseState::Declined);
    let next = dora(&svc, "52:54:00:20:00:04").await;
    assert_ne!(
        next, b_ip,
        "a declined address is not handed out again during its quarantine"
    );
    // INFORM: configuration, no address, no lease time.
    let mut r = req(RequestKind::Inform, "52:54:00:20:00:09");
    r.ciaddr = "10.20.0.77".parse().expect("ip");
    let ack = reply(svc.handle(&r).await.expect("inform"));
    assert_eq!(
        (ack.kind, ack.yiaddr, ack.lease_seconds),
        (ReplyKind::Ack, Ipv4Addr::UNSPECIFIED, None)
    );
    db.drop_db().await;
}

async fn pool_exhaustion_and_reservations(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let svc = service(st.clone());
    // An address reserved in the inventory for one machine is never offered to another, even
    // when that other client asks for it (option 50).
    let inv = plinth::app::inventory(
        &st,
        plinth::service::SecretBox::from_text(&plinth::service::SecretBox::generate_key_text())
            .expect("key"),
    );
    let spec = plinth::domain::MachineSpec {
        hostname: Some("reserved".into()),
        interfaces: vec![plinth::domain::Interface {
            mac: "52:54:00:21:01:01".parse().expect("mac"),
            ipv4: Some("10.20.0.105".parse().expect("ip")),
            boot: true,
            name: None,
        }],
        ..Default::default()
    };
    inv.create(spec, "test").await.expect("register");
    let mut d = req(RequestKind::Discover, "52:54:00:21:01:02");
    d.requested_ip = Some("10.20.0.105".parse().expect("ip"));
    let offer = reply(svc.handle(&d).await.expect("discover"));
    assert_ne!(
        offer.yiaddr.to_string(),
        "10.20.0.105",
        "reserved for another machine"
    );
    let mine = reply(
        svc.handle(&req(RequestKind::Discover, "52:54:00:21:01:01"))
            .await
            .expect("discover"),
    );
    assert_eq!(
        mine.yiaddr.to_string(),
        "10.20.0.105",
        "the owner gets its reservation"
    );
    // Both clients take another server's offer (RFC 2131 section 4.3.2, SELECTING): that frees
    // their offers here, so the rest of the test sees the whole pool.
    for (ip, mac) in [
        (offer.yiaddr, "52:54:00:21:01:02"),
        (mine.yiaddr, "52:54:00:21:01:01"),
    ] {
        let mut r = req(RequestKind::Request, mac);
        r.requested_ip = Some(ip);
        r.server_id = Some("10.20.0.254".parse().expect("ip"));
        assert_eq!(
            svc.handle(&r).await.expect("request"),
            Outcome::Silent("chose_other_server")
        );
    }
    // Ten addresses, one of them reserved: nine for everyone else, each handed out once.
    let mut got = Vec::new();
    for i in 0..9 {
        got.push(dora(&svc, &format!("52:54:00:21:00:{i:02x}")).await);
    }
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 9);
    assert!(!got.contains(&"10.20.0.105".parse().expect("ip")));
    assert_eq!(
        svc.handle(&req(RequestKind::Discover, "52:54:00:21:00:ff"))
            .await
            .expect("d"),
        Outcome::Silent("pool_exhausted")
    );
    db.drop_db().await;
}

async fn relayed_requests_record_option_82(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let svc = service(st.clone());
    let mut d = req(RequestKind::Discover, "52:54:00:22:00:01");
    d.giaddr = "10.30.0.1".parse().expect("ip");
    d.local_ips = vec![];
    // A giaddr written by a client on the local segment (not from the relay agent): silence.
    d.source = "10.20.0.66".parse().expect("ip");
    assert_eq!(
        svc.handle(&d).await.expect("d"),
        Outcome::Silent("relay_not_trusted")
    );
    d.source = RELAY.parse().expect("ip");
    d.circuit_id = Some(b"Gi1/0/7".to_vec());
    d.remote_id = Some(b"leaf-12".to_vec());
    let offer = reply(svc.handle(&d).await.expect("discover"));
    assert!(
        offer.yiaddr.to_string().starts_with("10.30.0."),
        "{offer:?}"
    );
    let mut r = d.clone();
    r.kind = RequestKind::Request;
    r.requested_ip = Some(offer.yiaddr);
    r.server_id = Some(offer.server_ip);
    assert_eq!(
        reply(svc.handle(&r).await.expect("request")).kind,
        ReplyKind::Ack
    );
    let l = st
        .leases
        .lease_by_ip(offer.yiaddr)
        .await
        .expect("l")
        .expect("row");
    assert_eq!(
        l.relay_circuit_id.as_deref(),
        Some(hex_of(b"Gi1/0/7").as_str())
    );
    assert_eq!(
        l.relay_remote_id.as_deref(),
        Some(hex_of(b"leaf-12").as_str())
    );
    assert_eq!(l.giaddr.as_deref(), Some("10.30.0.1"));
    // A relay for a network Plinth does not serve: silence.
    d.giaddr = "172.31.0.1".parse().expect("ip");
    assert_eq!(
        svc.handle(&d).await.expect("d"),
        Outcome::Silent("no_subnet")
    );
    // Option 82 is the relay agent's (RFC 3046): a client on the local segment that writes one
    // itself gets its lease, and the circuit it claims is not stored (issue 15, finding 6).
    let mut own = req(RequestKind::Discover, "52:54:00:22:00:02");
    own.source = "10.20.0.77".parse().expect("ip");
    own.circuit_id = Some(b"Gi1/0/7".to_vec());
    own.remote_id = Some(b"leaf-12".to_vec());
    let offer = reply(svc.handle(&own).await.expect("discover"));
    let mut r = own.clone();
    r.kind = RequestKind::Request;
    r.requested_ip = Some(offer.yiaddr);
    r.server_id = Some(offer.server_ip);
    assert_eq!(
        reply(svc.handle(&r).await.expect("request")).kind,
        ReplyKind::Ack
    );
    let l = st
        .leases
        .lease_by_ip(offer.yiaddr)
        .await
        .expect("l")
        .expect("row");
    assert_eq!(l.relay_circuit_id, None, "{l:?}");
    assert_eq!(l.relay_remote_id, None, "{l:?}");
    db.drop_db().await;
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn proxy_mode_answers_pxe_only(b: Backend) {
    let db = TestDb::new(b).await;
    let svc = service(db.stores().await);
    let mut d = req(RequestKind::Discover, "52:54:00:23:00:01");
    d.local_ips = vec!["10.40.0.1".parse().expect("ip")];
    d.client = BootClient::UefiPxe(Arch::Amd64);
    let offer = reply(svc.handle(&d).await.expect("discover"));
    assert_eq!(
        offer.yiaddr,
        Ipv4Addr::UNSPECIFIED,
        "proxyDHCP never hands out an address"
    );
    assert!(offer.pxe_vendor);
    assert_eq!(
        offer.boot.as_ref().map(|b| b.file.as_str()),
        Some("ipxe.efi")
    );
    assert_eq!(offer.lease_seconds, None);
    // The REQUEST on port 4011 gets the ACK with the boot file.
    let mut r = d.clone();
    r.kind = RequestKind::Request;
    r.proxy_port = true;
    r.ciaddr = "10.40.0.33".parse().expect("ip");
    let ack = reply(svc.handle(&r).await.expect("request"));
    assert_eq!(
        (ack.kind, ack.yiaddr),
        (ReplyKind::Ack, Ipv4Addr::UNSPECIFIED)
    );
    // Not a PXE client: the real DHCP server's business.
    d.client = BootClient::Plain;
    assert_eq!(
        svc.handle(&d).await.expect("d"),
        Outcome::Silent("proxy_not_pxe")
    );
    // A REQUEST on 67 in proxy mode is the address server's.
    let mut r67 = req(RequestKind::Request, "52:54:00:23:00:01");
    r67.local_ips = vec!["10.40.0.1".parse().expect("ip")];
    r67.client = BootClient::UefiPxe(Arch::Amd64);
    r67.requested_ip = Some("10.40.0.33".parse().expect("ip"));
    assert_eq!(
        svc.handle(&r67).await.expect("r"),
        Outcome::Silent("proxy_not_ours")
    );
    db.drop_db().await;
}

/// The pool cannot be emptied by made-up clients: MACs the inventory does not know hold at most
/// half the pool (REQUESTs straight for each address, as a flood would send them, included), one
/// relay circuit at most its share, and a known machine still gets an address afterwards.
async fn unknown_clients_and_circuits_hold_at_most_their_quota(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let svc = service(st.clone());
    // The pool 10.20.0.100-109: ten addresses, five for unknown clients.
    let mut bound = 0;
    let mut refused = 0;
    for n in 0..10u8 {
        let mut r = req(RequestKind::Request, &format!("02:00:00:66:00:{n:02x}"));
        r.known = false;
        r.requested_ip = Some(format!("10.20.0.{}", 100 + n).parse().expect("ip"));
        match svc.handle(&r).await.expect("request") {
            Outcome::Reply(a) if a.kind == ReplyKind::Ack => bound += 1,
            Outcome::Silent("quota_unknown_clients") => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((bound, refused), (5, 5));
    let mut d = req(RequestKind::Discover, "02:00:00:66:01:01");
    d.known = false;
    assert_eq!(
        svc.handle(&d).await.expect("d"),
        Outcome::Silent("quota_unknown_clients")
    );
    // A machine the inventory knows is not held back.
    let ip = dora(&svc, "52:54:00:66:00:01").await;
    assert!(ip.to_string().starts_with("10.20.0.1"), "{ip}");
    // Relayed: one circuit (a switch port) holds at most four addresses.
    let mut acked = 0;
    for n in 0..6u8 {
        let mut d = req(RequestKind::Discover, &format!("52:54:00:66:02:{n:02x}"));
        d.giaddr = "10.30.0.1".parse().expect("ip");
        d.source = RELAY.parse().expect("ip");
        d.local_ips = vec![];
        d.circuit_id = Some(b"Gi1/0/9".to_vec());
        if let Outcome::Reply(o) = svc.handle(&d).await.expect("discover") {
            let mut r = d.clone();
            r.kind = RequestKind::Request;
            r.requested_ip = Some(o.yiaddr);
            r.server_id = Some(o.server_ip);
            if let Outcome::Reply(a) = svc.handle(&r).await.expect("request") {
                if a.kind == ReplyKind::Ack {
                    acked += 1;
                }
            }
        }
    }
    assert_eq!(acked, 4, "four leases on one circuit");
    db.drop_db().await;
}

both_backends!(
    unknown_clients_and_circuits_hold_at_most_their_quota,
    rfc2131_request_rules,
    pool_exhaustion_and_reservations,
    relayed_requests_record_option_82,
    proxy_mode_answers_pxe_only,
);

/// Two Plinth instances (two services, two pools of connections) on one PostgreSQL, 60 clients
/// racing for a 10-address pool: every address is ACKed to exactly one MAC, and the database
/// agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_on_postgres_never_share_an_address() {
    let db = TestDb::new(Backend::Postgres).await;
    let a = Arc::new(service(db.stores().await));
    let b = Arc::new(service(db.stores().await));
    let mut tasks = Vec::new();
    for i in 0..60u32 {
        let svc = if i % 2 == 0 { a.clone() } else { b.clone() };
        let other = if i % 2 == 0 { b.clone() } else { a.clone() };
        tasks.push(tokio::spawn(async move {
            let mac = format!("52:54:00:24:{:02x}:{:02x}", i >> 8, i & 255);
            let mut d = req(RequestKind::Discover, &mac);
            d.local_ips = vec!["10.20.0.1".parse().expect("ip")];
            let offer = match svc.handle(&d).await.expect("discover") {
                Outcome::Reply(r) => r,
                Outcome::Silent(_) => return None,
            };
            // Half the clients send their REQUEST to the other instance (it shares the database).
            let mut r = req(RequestKind::Request, &mac);
            r.requested_ip = Some(offer.yiaddr);
            r.server_id = Some(offer.server_ip);
            match other.handle(&r).await.expect("request") {
                Outcome::Reply(ack) if ack.kind == ReplyKind::Ack => Some((mac, ack.yiaddr)),
                _ => None,
            }
        }));
    }
    let mut acked: Vec<(String, Ipv4Addr)> = Vec::new();
    for t in tasks {
        if let Some(x) = t.await.expect("join") {
            acked.push(x);
        }
    }
    let mut ips: Vec<Ipv4Addr> = acked.iter().map(|(_, ip)| *ip).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(
        ips.len(),
        acked.len(),
        "an address was ACKed to two MACs: {acked:?}"
    );
    assert_eq!(acked.len(), 10, "the whole pool is handed out, once each");
    let st = db.stores().await;
    for (mac, ip) in &acked {
        let l = st
            .leases
            .lease_by_ip(*ip)
            .await
            .expect("lease")
            .expect("row");
        assert_eq!(l.mac, mac.parse::<MacAddr>().expect("mac"));
        assert_eq!(l.state, LeaseState::Bound);
    }
    db.drop_db().await;
}

/// On PostgreSQL each instance answers DHCP's look-ups from memory that follows what the other
/// instances commit: a lease claimed through one store shows in another's `lease_by_ip` within a
/// bounded time, and so does a row written by a transaction that began before the other store's
/// reads and committed after several of them (each read asks for the rows stamped at or after the
/// oldest transaction running at the previous one). `lease_at` reads the committed row at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_instance_follows_the_leases_other_instances_commit() {
    use sqlx::Connection as _;
    let db = TestDb::new(Backend::Postgres).await;
    let (a, b) = (db.stores().await, db.stores().await);
    let net = "10.20.0.0/24";
    let seen_by_b = |ip: &'static str, mac: &'static str| {
        let b = b.clone();
        async move {
            // At most 10 s (100 reads of 100 ms each); a view of 100 ms follows in about two.
            for _ in 0..200 {
                let l = b
                    .leases
                    .lease_by_ip(ip.parse().expect("ip"))
                    .await
                    .expect("look-up");
                if l.is_some_and(|l| l.mac == mac.parse::<MacAddr>().expect("mac")) {
                    return true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            false
        }
    };
    let claim = support::lease_claim("10.20.0.40", net, "52:54:00:30:00:01", LeaseState::Bound);
    assert!(a.leases.claim_lease(&claim).await.expect("claim"));
    assert!(
        b.leases
            .lease_at("10.20.0.40".parse().expect("ip"))
            .await
            .expect("lease_at")
            .is_some(),
        "lease_at reads the committed row"
    );
    assert!(
        seen_by_b("10.20.0.40", "52:54:00:30:00:01").await,
        "the other instance's lease view never showed the claim"
    );

    // A slow writer: its transaction takes an id, then later transactions commit (a claim
    // through a) and b reads the table several times, then it commits. Its row is older than b's
    // reads and than the claim but must still be seen.
    let mut slow = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let mut tx = slow.begin().await.expect("begin");
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *tx)
        .await
        .expect("xid");
    let later = support::lease_claim("10.20.0.42", net, "52:54:00:30:00:04", LeaseState::Bound);
    assert!(a.leases.claim_lease(&later).await.expect("claim"));
    assert!(seen_by_b("10.20.0.42", "52:54:00:30:00:04").await);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let now = chrono::Utc::now().timestamp_millis();
    sqlx::query(
        "INSERT INTO dhcp_leases (ip, subnet, mac, state, expires_ms, updated_ms) \
         VALUES ($1, $2, '52:54:00:30:00:02', 'bound', $3, $4)",
    )
    .bind(i64::from(u32::from(
        "10.20.0.41".parse::<Ipv4Addr>().expect("ip"),
    )))
    .bind(net)
    .bind(now + 600_000)
    .bind(now)
    .execute(&mut *tx)
    .await
    .expect("insert");
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    tx.commit().await.expect("commit");
    assert!(
        seen_by_b("10.20.0.41", "52:54:00:30:00:02").await,
        "a row committed by a transaction older than the view's last read was never seen"
    );
    // And the claim through b of the address a just bound to another MAC is refused by the
    // database whatever b's view says.
    let other = support::lease_claim("10.20.0.40", net, "52:54:00:30:00:03", LeaseState::Bound);
    assert!(!b.leases.claim_lease(&other).await.expect("claim"));
    drop(slow);
    db.drop_db().await;
}

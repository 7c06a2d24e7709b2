//! DHCP decisions against the real stores (SQLite and PostgreSQL): RFC 2131 request handling, NAKs,
//! release and decline, relays with option 82, proxyDHCP, and two instances allocating from one
//! PostgreSQL pool under contention without giving an address twice.

use crate::support;

use std::net::Ipv4Addr;
use std::sync::Arc;

use plinth::domain::dhcp::{Arch, BootClient, BootFiles, Ipv4Range, Subnet, SubnetMode};
use plinth::domain::MacAddr;
use plinth::service::dhcp::{
    DhcpRequest, DhcpService, LeaseTiming, Outcome, ReplyKind, RequestKind,
};
use plinth::service::{LeaseClaim, LeaseState, Stores};
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
    }
}

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
    }
}

async fn store(db: &TestDb) -> Stores {
    plinth::store::open(&plinth::store::StoreOptions {
        url: db.url.clone(),
        max_connections: 8,
        migrate: true,
    })
    .await
    .expect("store")
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

fn reply(o: Outcome) -> plinth::service::dhcp::DhcpReply {
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
    let st = store(&db).await;
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
    // RELEASE frees the address; DECLINE quarantines one.
    let mut r = req(RequestKind::Release, "52:54:00:20:00:01");
    r.ciaddr = a;
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
    let st = store(&db).await;
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
    let st = store(&db).await;
    let svc = service(st.clone());
    let mut d = req(RequestKind::Discover, "52:54:00:22:00:01");
    d.giaddr = "10.30.0.1".parse().expect("ip");
    d.local_ips = vec![];
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
    db.drop_db().await;
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn proxy_mode_answers_pxe_only(b: Backend) {
    let db = TestDb::new(b).await;
    let svc = service(store(&db).await);
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

/// A claim in the subnet of the group-commit tests.
fn claim(ip: &str, mac: &str, state: LeaseState) -> LeaseClaim {
    support::lease_claim(ip, "10.20.0.0/24", mac, state)
}

/// Claims go through the store's group commit: many at once share transactions, and each still
/// gets the answer it would get alone. 64 MACs racing for one address: exactly one wins, and the
/// row is the winner's; 200 MACs with an address each, plus a MAC moving between two addresses
/// and a release, all at once: every distinct claim is granted, the moved MAC keeps only its
/// last address, the released address is released. An offer never ends a bound lease.
async fn concurrent_claims_are_batched_and_exclusive(b: Backend) {
    let db = TestDb::new(b).await;
    let st = store(&db).await;
    let race: Vec<_> = (0..64u32)
        .map(|i| {
            let st = st.clone();
            tokio::spawn(async move {
                let mac = format!("52:54:00:25:00:{i:02x}");
                let won = st
                    .leases
                    .claim_lease(&claim("10.20.0.150", &mac, LeaseState::Bound))
                    .await
                    .expect("claim");
                (mac, won)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for t in race {
        let (mac, won) = t.await.expect("join");
        if won {
            winners.push(mac);
        }
    }
    assert_eq!(winners.len(), 1, "one address, one MAC: {winners:?}");
    let row = st
        .leases
        .lease_by_ip("10.20.0.150".parse().expect("ip"))
        .await
        .expect("row")
        .expect("row");
    assert_eq!(row.mac.to_string(), winners[0]);
    assert_eq!(row.state, LeaseState::Bound);

    // A MAC with a bound lease on .151; a released-to-be lease on .152.
    let mover = "52:54:00:25:01:01";
    assert!(st
        .leases
        .claim_lease(&claim("10.20.0.151", mover, LeaseState::Bound))
        .await
        .expect("claim"));
    let leaver = "52:54:00:25:01:02";
    assert!(st
        .leases
        .claim_lease(&claim("10.20.0.152", leaver, LeaseState::Bound))
        .await
        .expect("claim"));
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let st = st.clone();
        tasks.push(tokio::spawn(async move {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 21, 0, 0)) + i);
            let mac = format!("52:54:00:26:{:02x}:{:02x}", i >> 8, i & 255);
            st.leases
                .claim_lease(&claim(&ip.to_string(), &mac, LeaseState::Bound))
                .await
                .expect("claim")
        }));
    }
    let moved = {
        let st = st.clone();
        tokio::spawn(async move {
            st.leases
                .claim_lease(&claim("10.20.0.153", mover, LeaseState::Bound))
                .await
                .expect("claim")
        })
    };
    let released = {
        let st = st.clone();
        tokio::spawn(async move {
            let now = chrono::Utc::now().timestamp_millis();
            st.leases
                .end_lease(
                    "10.20.0.152".parse().expect("ip"),
                    leaver.parse().expect("mac"),
                    LeaseState::Released,
                    now,
                    now,
                )
                .await
                .expect("end")
        })
    };
    for t in tasks {
        assert!(t.await.expect("join"), "a free address is granted");
    }
    assert!(moved.await.expect("join"));
    assert!(released.await.expect("join"));
    let of_mover = st
        .leases
        .leases_of_mac(mover.parse().expect("mac"))
        .await
        .expect("leases");
    let states: Vec<(String, LeaseState)> = of_mover
        .iter()
        .map(|l| (l.ip.to_string(), l.state))
        .collect();
    assert!(
        states.contains(&("10.20.0.153".into(), LeaseState::Bound))
            && states.contains(&("10.20.0.151".into(), LeaseState::Expired)),
        "the moved MAC keeps only its new address: {states:?}"
    );
    // An offer to the moved MAC elsewhere (a late duplicate DISCOVER) leaves its bound lease
    // alone; binding the other address ends it.
    let state_of = |ip: &'static str| {
        let st = st.clone();
        async move {
            st.leases
                .lease_by_ip(ip.parse().expect("ip"))
                .await
                .expect("row")
                .expect("row")
                .state
        }
    };
    assert!(st
        .leases
        .claim_lease(&claim("10.20.0.154", mover, LeaseState::Offered))
        .await
        .expect("claim"));
    assert_eq!(state_of("10.20.0.153").await, LeaseState::Bound);
    assert_eq!(state_of("10.20.0.154").await, LeaseState::Offered);
    assert!(st
        .leases
        .claim_lease(&claim("10.20.0.154", mover, LeaseState::Bound))
        .await
        .expect("claim"));
    assert_eq!(state_of("10.20.0.153").await, LeaseState::Expired);
    assert_eq!(state_of("10.20.0.154").await, LeaseState::Bound);
    assert_eq!(state_of("10.20.0.152").await, LeaseState::Released);
    // The released address is free for another MAC; a bound one is not.
    assert!(st
        .leases
        .claim_lease(&claim(
            "10.20.0.152",
            "52:54:00:25:01:03",
            LeaseState::Bound
        ))
        .await
        .expect("claim"));
    assert!(!st
        .leases
        .claim_lease(&claim(
            "10.20.0.154",
            "52:54:00:25:01:03",
            LeaseState::Bound
        ))
        .await
        .expect("claim"));
    db.drop_db().await;
}

both_backends!(
    concurrent_claims_are_batched_and_exclusive,
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
    let a = Arc::new(service(store(&db).await));
    let b = Arc::new(service(store(&db).await));
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
    let st = store(&db).await;
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

/// On SQLite every write shares one connection; an ACK waits for its lease's commit. A lease
/// commit queued behind a crowd of other writers (API writes, imports, state changes) goes ahead
/// of them: at most the writer holding the connection and the next one finish first. (A
/// current-thread runtime: every writer is queued before the claim is made.)
#[tokio::test]
async fn sqlite_lease_commits_go_ahead_of_queued_writers() {
    let db = TestDb::new(Backend::Sqlite).await;
    let st = store(&db).await;
    const WRITERS: usize = 200;
    let order = Arc::new(std::sync::Mutex::new(Vec::<&'static str>::new()));
    let mut tasks = Vec::new();
    for n in 0..WRITERS {
        let (st, order) = (st.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let token = plinth::service::NewToken {
                id: uuid::Uuid::new_v4(),
                name: format!("writer-{n}"),
                role: plinth::service::ApiRole::Viewer,
                hash: [
                    *uuid::Uuid::new_v4().as_bytes(),
                    *uuid::Uuid::new_v4().as_bytes(),
                ]
                .concat(),
                expires_at: None,
            };
            st.tokens.create_token(&token).await.expect("token");
            order.lock().expect("order").push("write");
        }));
    }
    // Let every writer reach its queue.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(
        order.lock().expect("order").len() < WRITERS / 2,
        "the writers finished before the claim was made: nothing was queued"
    );
    assert!(st
        .leases
        .claim_lease(&claim(
            "10.20.0.160",
            "52:54:00:aa:00:01",
            LeaseState::Bound
        ))
        .await
        .expect("claim"));
    order.lock().expect("order").push("lease");
    for t in tasks {
        t.await.expect("writer");
    }
    let order = order.lock().expect("order").clone();
    let ahead = order.iter().position(|w| *w == "lease").expect("lease");
    assert!(
        ahead <= 3,
        "{ahead} of {WRITERS} queued writes committed before the lease"
    );
    assert_eq!(order.len(), WRITERS + 1);
    db.drop_db().await;
}

//! Fuzz the DHCP front door's decode-and-decide path with arbitrary bytes: `wire::decode`, then
//! for every request it accepts a real `DhcpService` decision against a SQLite lease store (in a
//! temporary directory on tmpfs when there is one), then `wire::encode` of the answer, which must
//! decode again as a reply to the same transaction. A panic, a store error or an answer that does
//! not round-trip is a finding.
//!
//! Shared by the fuzz target (`fuzz/fuzz_targets/dhcp_decode_decide.rs`) and the replay of
//! `fuzz/regressions/dhcp_decode_decide/` and `fuzz/seeds/dhcp_decode_decide/` in `tests/it/fuzz_replay.rs`.

use std::net::Ipv4Addr;
use std::sync::{Arc, OnceLock};

use dhcproto::v4;
use dhcproto::{Decodable, Decoder};
use plinth::dhcp::wire;
use plinth::domain::dhcp::{BootFiles, Ipv4Range, Subnet, SubnetMode};
use plinth::service::provisioning::dhcp::{DhcpService, LeaseTiming, Outcome};
use plinth::service::LeaseStore;

struct Ctx {
    rt: tokio::runtime::Runtime,
    service: DhcpService,
    _dir: tempfile::TempDir,
}

fn subnet(net: &str, server: &str, pool: Option<&str>, mode: SubnetMode) -> Subnet {
    Subnet {
        net: net.parse().expect("net"),
        mode,
        server_ip: server.parse().expect("ip"),
        pool: pool
            .map(|p| vec![p.parse::<Ipv4Range>().expect("range")])
            .unwrap_or_default(),
        routers: vec![server.parse().expect("ip")],
        dns: vec![server.parse().expect("ip")],
        ntp: vec![],
        domain: Some("fuzz.test".into()),
        lease_seconds: 600,
        relay_agents: vec![Ipv4Addr::new(10, 20, 0, 254)],
        unknown_permille: 500,
        leases_per_circuit: 4,
        router_advert: None,
    }
}

fn ctx() -> &'static Ctx {
    static CTX: OnceLock<Ctx> = OnceLock::new();
    CTX.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            std::path::PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::tempdir_in(base).expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("fuzz.db").display());
        let store = rt
            .block_on(plinth::store::open(&plinth::store::StoreOptions {
                url,
                max_connections: 2,
                migrate: true,
            }))
            .expect("store");
        let leases: Arc<dyn LeaseStore> = store.leases.clone();
        let service = DhcpService::new(
            leases,
            vec![
                // Small pools so exhaustion and reuse are reached quickly.
                subnet(
                    "10.20.0.0/24",
                    "10.20.0.1",
                    Some("10.20.0.100-10.20.0.115"),
                    SubnetMode::Authoritative,
                ),
                subnet(
                    "10.30.0.0/24",
                    "10.20.0.1",
                    Some("10.30.0.10-10.30.0.13"),
                    SubnetMode::Authoritative,
                ),
                subnet("10.40.0.0/24", "10.40.0.1", None, SubnetMode::Proxy),
                subnet("10.50.0.0/24", "10.50.0.1", None, SubnetMode::Off),
            ],
            BootFiles {
                http_base: "http://10.20.0.1:8080".into(),
            },
            LeaseTiming::default(),
        );
        Ctx {
            rt,
            service,
            _dir: dir,
        }
    })
}

/// One input, checked as the module's paragraph says; panics on a finding.
pub fn run(data: &[u8]) {
    let c = ctx();
    // Which socket the packet "arrived" on comes from the xid bytes, so one input is one case.
    let sel = data.get(4).copied().unwrap_or(0);
    let proxy_port = sel & 1 == 1;
    let local: &[Ipv4Addr] = match (sel >> 1) & 3 {
        0 => &[Ipv4Addr::new(10, 20, 0, 1)],
        1 => &[Ipv4Addr::new(10, 40, 0, 1)],
        2 => &[Ipv4Addr::new(10, 50, 0, 1)],
        _ => &[],
    };
    let (msg, mut req) = match wire::decode(data, proxy_port, local) {
        Ok(x) => x,
        Err(reason) => {
            assert!(!reason.is_empty());
            return;
        }
    };
    // Where it came from (the relay agent, a client's own address, or none yet) and whether the
    // inventory knows the MAC, from two more bits.
    req.source = match (sel >> 3) & 3 {
        0 => Ipv4Addr::new(10, 20, 0, 254),
        1 => req.ciaddr,
        _ => Ipv4Addr::UNSPECIFIED,
    };
    req.known = (sel >> 5) & 1 == 1;
    let outcome =
        c.rt.block_on(c.service.handle(&req))
            .expect("the store does not fail on any request");
    let Outcome::Reply(reply) = outcome else {
        return;
    };
    let bytes = wire::encode(&msg, &reply).expect("every answer encodes");
    let back = v4::Message::decode(&mut Decoder::new(&bytes)).expect("the answer decodes");
    assert_eq!(back.xid(), msg.xid());
    assert_eq!(back.opcode(), v4::Opcode::BootReply);
    assert_eq!(back.chaddr(), msg.chaddr());
    assert_eq!(back.yiaddr(), reply.yiaddr);
    assert!(back.opts().msg_type().is_some());
}

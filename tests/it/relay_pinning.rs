//! Relay circuit pinning (issue 15, item 1) over the wire: Plinth in a network namespace, a relay
//! agent built here sending relayed DHCP (giaddr, option 82) from the configured relay address.
//! A known machine's first relayed REQUEST pins its circuit; the same MAC from another switch port
//! is not answered, is counted and is an event on its timeline; an operator moves the pin and the
//! new port is answered.

use crate::support;

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use dhcproto::v4::{self, DhcpOption, MessageType, OptionCode};
use plinth::domain::{Interface, MachineSpec};

use crate::dhcp_peers::{collect, encode, msg_type, pxe_message};
use support::lan::{self, Lan};
use support::peers::{metrics, sample, start_plinth, Agent, Plinth};
use support::{Backend, TestDb};

/// Option 82 with circuit id `circuit` and remote id `leaf-1`.
pub(crate) fn option_82(circuit: &[u8]) -> Vec<u8> {
    let remote = b"leaf-1";
    let mut o = vec![1, circuit.len() as u8];
    o.extend_from_slice(circuit);
    o.extend_from_slice(&[2, remote.len() as u8]);
    o.extend_from_slice(remote);
    o
}

/// A relayed message of `kind` for `mac` from the switch port `circuit`.
pub(crate) fn relayed(mac: &[u8; 6], xid: u32, kind: MessageType, circuit: &[u8]) -> v4::Message {
    let mut m = pxe_message(mac, xid, kind, Ipv4Addr::UNSPECIFIED);
    m.set_giaddr(Ipv4Addr::new(10, 86, 0, 1)).set_hops(1);
    m.opts_mut()
        .insert(DhcpOption::Unknown(v4::UnknownOption::new(
            OptionCode::RelayAgentInformation,
            option_82(circuit),
        )));
    m
}

/// Send `m` to Plinth and collect its answers (a bounded wait).
pub(crate) fn ask(agent: &mut Agent, m: &v4::Message) -> Vec<v4::Message> {
    agent.send("10.85.0.1:67".parse().expect("addr"), &encode(m));
    collect(agent, m.xid(), Duration::from_secs(3))
        .into_iter()
        .map(|(_, m)| m)
        .collect()
}

async fn events_of_kind(url: &str, kind: &str) -> Vec<String> {
    use sqlx::Connection as _;
    let mut c = sqlx::SqliteConnection::connect(url).await.expect("db");
    sqlx::query_scalar::<_, String>("SELECT detail FROM events WHERE kind = $1")
        .bind(kind)
        .fetch_all(&mut c)
        .await
        .expect("events")
}

/// The relayed subnet of a [`RelayLab`], as `[dhcp]` configuration: 10.86.0.0/24 behind the relay
/// agent 10.85.0.2.
pub(crate) const RELAYED_SUBNET: &str = r#"[[dhcp.subnet]]
cidr = "10.86.0.0/24"
server_ip = "10.85.0.1"
pool = ["10.86.0.100-10.86.0.200"]
routers = ["10.86.0.1"]
relay_agents = ["10.85.0.2"]
"#;

/// Plinth serving DHCP in a namespace (10.85.0.1) and a relay agent in another (10.85.0.2, a
/// configured relay agent) relaying for 10.86.0.0/24 with `giaddr` 10.86.0.1; all of it ends
/// with the value (agent, then Plinth and the namespaces).
pub(crate) struct RelayLab {
    /// The relay agent's socket (port 67 on the relay's interface).
    pub agent: Agent,
    /// Plinth in the server's namespace.
    pub plinth: Plinth,
    /// The segment.
    pub lan: Lan,
}

/// Start a [`RelayLab`]; Plinth's data and config in `dir`, its inventory at `db_url`.
pub(crate) fn relay_lab(tag: &str, dir: &Path, db_url: &str) -> RelayLab {
    let mut lan = Lan::new(tag);
    let srv = lan.host(&["10.85.0.1/24"], None);
    let relay = lan.host(&["10.85.0.2/24"], None);
    lan::ip(&[
        "-n",
        &relay.ns,
        "addr",
        "add",
        "10.86.0.1/24",
        "dev",
        &relay.ifname,
    ]);
    lan::ip(&[
        "-n",
        &srv.ns,
        "route",
        "add",
        "10.86.0.0/24",
        "via",
        "10.85.0.2",
    ]);
    let plinth = start_plinth(
        &mut lan,
        &srv,
        dir,
        db_url,
        &format!(
            "boot_url = \"http://10.85.0.1:8080\"\n[[dhcp.subnet]]\ncidr = \"10.85.0.0/24\"\n\
             server_ip = \"10.85.0.1\"\npool = [\"10.85.0.100-10.85.0.200\"]\n{RELAYED_SUBNET}"
        ),
    );
    let agent = Agent::start(&lan, &relay, 67);
    RelayLab { agent, plinth, lan }
}

/// A relayed DISCOVER then REQUEST of `mac` from the switch port `circuit`: the ACK.
pub(crate) fn relayed_lease(
    agent: &mut Agent,
    mac: &[u8; 6],
    xid: u32,
    circuit: &[u8],
) -> v4::Message {
    let offers = ask(agent, &relayed(mac, xid, MessageType::Discover, circuit));
    assert_eq!(offers.len(), 1, "{offers:?}");
    let mut req = relayed(mac, xid + 1, MessageType::Request, circuit);
    req.opts_mut()
        .insert(DhcpOption::RequestedIpAddress(offers[0].yiaddr()));
    req.opts_mut()
        .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 85, 0, 1)));
    let acks = ask(agent, &req);
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(msg_type(&acks[0]), Some(MessageType::Ack));
    acks[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_is_pinned_to_its_first_relay_circuit() {
    let tmp = tempfile::tempdir().expect("tmp");
    let db = TestDb::new(Backend::Sqlite).await;
    // The machine, known to the inventory before it boots.
    let store = plinth::store::open(&plinth::store::StoreOptions {
        url: db.url.clone(),
        max_connections: 2,
        migrate: true,
    })
    .await
    .expect("store");
    let secrets =
        plinth::service::SecretBox::from_text(&plinth::service::SecretBox::generate_key_text())
            .expect("key");
    let mac = [0x52, 0x54, 0, 0x86, 0, 1];
    let m = plinth::app::inventory(&store, secrets.clone())
        .create(
            MachineSpec {
                hostname: Some("pinned-1".into()),
                interfaces: vec![Interface {
                    mac: "52:54:00:86:00:01".parse().expect("mac"),
                    ipv4: None,
                    boot: true,
                    name: None,
                }],
                ..Default::default()
            },
            "test",
        )
        .await
        .expect("register");

    let RelayLab {
        mut agent,
        plinth: p,
        lan,
    } = relay_lab("cp", &tmp.path().join("p"), &db.url);

    // Port 1: DISCOVER, REQUEST: bound, and the circuit is pinned.
    let ip = relayed_lease(&mut agent, &mac, 0x0860_0001, b"port-1").yiaddr();
    let pin = store
        .leases
        .circuit_pin(m.id)
        .await
        .expect("pin")
        .expect("pinned at the first REQUEST");
    assert_eq!(pin.relay, "10.86.0.1");
    assert_eq!(
        pin.circuit_id.as_deref(),
        Some(hex::encode(b"port-1").as_str())
    );
    assert_eq!(pin.pinned_by, "dhcp");

    // Port 2, same MAC: no OFFER, no ACK; counted; on the machine's timeline.
    let offers = ask(
        &mut agent,
        &relayed(&mac, 0x0860_0003, MessageType::Discover, b"port-2"),
    );
    assert!(offers.is_empty(), "answered on another circuit: {offers:?}");
    let mut req = relayed(&mac, 0x0860_0004, MessageType::Request, b"port-2");
    req.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
    let acks = ask(&mut agent, &req);
    assert!(acks.is_empty(), "acknowledged on another circuit: {acks:?}");
    let counted = sample(
        &metrics(&lan, &p),
        "plinth_dhcp_dropped_total",
        "reason",
        "circuit_mismatch",
    );
    assert!(counted >= 2.0, "counted {counted}");
    let mut seen = Vec::new();
    for _ in 0..40 {
        seen = events_of_kind(&db.url, "dhcp.circuit_mismatch").await;
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        seen.iter().any(|d| d.contains(&hex::encode(b"port-2"))),
        "{seen:?}"
    );
    // The pin is unchanged; port 1 still works.
    let offers = ask(
        &mut agent,
        &relayed(&mac, 0x0860_0005, MessageType::Discover, b"port-1"),
    );
    assert_eq!(offers.len(), 1, "{offers:?}");

    // The operator moves the machine to port 2.
    let configs = plinth::app::config_service(&store, secrets, None);
    configs
        .set_circuit_pin(
            m.id,
            Some("10.86.0.1"),
            Some(&hex::encode(b"port-2")),
            None,
            "tech",
        )
        .await
        .expect("set pin");
    let offers = ask(
        &mut agent,
        &relayed(&mac, 0x0860_0006, MessageType::Discover, b"port-2"),
    );
    assert_eq!(offers.len(), 1, "the new port is answered: {offers:?}");
    let offers = ask(
        &mut agent,
        &relayed(&mac, 0x0860_0007, MessageType::Discover, b"port-1"),
    );
    assert!(offers.is_empty(), "the old port is not: {offers:?}");
    assert_eq!(events_of_kind(&db.url, "dhcp.circuit_set").await.len(), 1);
    drop(agent);
    db.drop_db().await;
}

/// `plinth` against `srv` with the operator's token.
fn cli(srv: &support::TestServer, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(support::peers::BIN)
        .env_remove("PLINTH_CONFIG")
        .env("PLINTH_SERVER", &srv.base)
        .env("PLINTH_TOKEN", &srv.operator)
        .args(args)
        .output()
        .expect("plinth runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The operator's side: `plinth machine circuit` sets, shows and clears a pin, `machine show`
/// shows it, bad values are refused naming the field, and each change is an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_and_change_a_machines_circuit() {
    let srv = support::TestServer::start(Backend::Sqlite).await;
    let r = srv
        .req(reqwest::Method::POST, "/api/v1/machines", &srv.operator)
        .json(&serde_json::json!({
            "hostname": "pin-2",
            "interfaces": [{ "mac": "52:54:00:86:00:02", "boot": true }],
        }))
        .send()
        .await
        .expect("create");
    assert_eq!(r.status().as_u16(), 201);
    let (ok, out) = cli(&srv, &["machine", "circuit", "pin-2"]);
    assert!(ok && out.contains("no circuit pinned"), "{out}");
    let (ok, out) = cli(
        &srv,
        &[
            "machine",
            "circuit",
            "pin-2",
            "--relay",
            "10.86.0.1",
            "--circuit-id",
            "706F72742D33",
        ],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("relay 10.86.0.1 circuit 706f72742d33"),
        "{out}"
    );
    let (ok, out) = cli(&srv, &["machine", "show", "pin-2"]);
    assert!(
        ok && out.contains("dhcp_circuit") && out.contains("706f72742d33"),
        "{out}"
    );
    let (ok, out) = cli(
        &srv,
        &[
            "machine",
            "circuit",
            "pin-2",
            "--relay",
            "10.86.0.1",
            "--circuit-id",
            "xyz",
        ],
    );
    assert!(!ok && out.contains("circuit_id"), "{out}");
    let (ok, out) = cli(&srv, &["machine", "circuit", "pin-2", "--clear"]);
    assert!(ok && out.contains("no circuit pinned"), "{out}");
    let (ok, out) = cli(&srv, &["machine", "show", "pin-2", "--json"]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert!(v["dhcp_circuit"].is_null(), "{v}");
    let r: serde_json::Value = srv
        .req(
            reqwest::Method::GET,
            "/api/v1/events?kind=dhcp.circuit",
            &srv.viewer,
        )
        .send()
        .await
        .expect("events")
        .json()
        .await
        .expect("json");
    let kinds: Vec<&str> = r
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"dhcp.circuit_set") && kinds.contains(&"dhcp.circuit_cleared"),
        "{kinds:?}"
    );
    // A viewer may look, not change.
    let r = srv
        .req(
            reqwest::Method::DELETE,
            "/api/v1/machines/pin-2/dhcp-circuit",
            &srv.viewer,
        )
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status().as_u16(), 403);
    srv.finish().await;
}

//! From installed machines to a cluster, against a running Plinth and the Talos API service of
//! the tests on loopback addresses (one per node, all on one port): the install is verified over
//! mutual TLS (a foreign certificate or another Talos version fails it), the first control plane
//! is bootstrapped exactly once (never again on a reinstall, refused by hand naming when and
//! where), two instances on one PostgreSQL race and exactly one bootstraps, a Plinth stopped
//! mid-call never calls again, health and its gauges, the scheduler's measured quorum margin, and
//! talosconfig / kubeconfig for admins only, checked with openssl.
//!
//! The workflow engine runs on its own every hour here; the tests tick it themselves.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::talos_node::{NodeOptions, SharedCluster, TalosNode};
use crate::support::{self, Ask as _, Backend, TestServer};
use crate::talos_configs::{apply_dir, schemas};
use plinth::service::clusters::{BootstrapError, ClusterSettings};
use plinth::service::Workflows;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn extra(port: u16) -> String {
    format!(
        "[talos]\nschema_dir = \"{}\"\n[workflows]\ntick_seconds = 3600\ntalos_api_port = {port}\nhealth_seconds = 3600\n",
        schemas().display()
    )
}

async fn services(srv: &TestServer, extra: &str, instance: &str) -> Workflows {
    let cfg = support::config(&srv.db, extra);
    let store = plinth::app::open_store(&cfg, false).await.expect("store");
    let secrets = plinth::app::secret_box(&cfg).expect("key");
    let inventory = plinth::app::inventory(&store, secrets.clone());
    let configs = plinth::app::config_service(&store, secrets, Some(schemas()));
    let bmc = plinth::app::bmc_service(
        &inventory,
        &store,
        Arc::new(plinth::bmc::RedfishConnector::default()),
    );
    let clusters = plinth::app::clusters(
        &configs,
        &store,
        Arc::new(plinth::talos_api::TalosApiClient::new(
            plinth::talos_api::ClientSettings {
                connect_timeout: Duration::from_secs(2),
                call_timeout: Duration::from_secs(5),
                attempts: 2,
                backoff: Duration::from_millis(100),
            },
        )),
        ClusterSettings {
            talos_api_port: cfg.workflows.talos_api_port,
            health_wait: Duration::from_secs(3),
            instance: instance.into(),
            ..Default::default()
        },
    );
    plinth::app::workflows(
        &inventory,
        &configs,
        &bmc,
        &store,
        clusters,
        cfg.workflows.clone(),
    )
}

async fn get(srv: &TestServer, path: &str) -> Value {
    srv.req(Method::GET, path, &srv.admin).answer().await.json()
}

async fn post(srv: &TestServer, token: &str, path: &str, body: Value) -> (StatusCode, String) {
    let r = srv
        .req(Method::POST, path, token)
        .json(&body)
        .answer()
        .await;
    (r.status, r.text)
}

/// One machine of the lab: name, role, MAC, UUID, loopback address.
#[derive(Clone)]
struct Spec {
    name: &'static str,
    cp: bool,
    n: u8,
}

impl Spec {
    fn mac(&self) -> String {
        format!("52:54:00:19:00:{:02x}", self.n)
    }
    fn uuid(&self) -> String {
        format!("5b6c2a1e-8f3d-4c2b-9a7e-0d1f2e3c4b{:02x}", self.n)
    }
    fn ip(&self) -> IpAddr {
        format!("127.0.19.{}", self.n).parse().expect("ip")
    }
}

const CP1: Spec = Spec {
    name: "cp-1",
    cp: true,
    n: 1,
};
const CP2: Spec = Spec {
    name: "cp-2",
    cp: true,
    n: 2,
};
const CP3: Spec = Spec {
    name: "cp-3",
    cp: true,
    n: 3,
};
const W1: Spec = Spec {
    name: "w-1",
    cp: false,
    n: 4,
};

fn write_inventory(dir: &Path, machines: &[Spec], cluster_extra: &str) -> PathBuf {
    let inv = dir.join("inv");
    std::fs::create_dir_all(&inv).expect("mkdir");
    let secrets = dir.join("secrets.yaml");
    std::fs::write(
        &secrets,
        plinth::talos::secrets::SecretsBundle::generate()
            .expect("bundle")
            .to_yaml()
            .expect("yaml"),
    )
    .expect("secrets");
    let mut doc = format!(
        "kind: Cluster\nname: lab\nendpoint: https://10.88.0.10:6443\ntalosVersion: v1.12.11\nsecrets: {}\n{cluster_extra}---\nkind: Profile\nname: vm\ninstallDisk:\n  type: ssd\n",
        secrets.display()
    );
    for m in machines {
        let role = if m.cp { "control-plane" } else { "worker" };
        doc.push_str(&format!(
            "---\nkind: Machine\nhostname: {}\nsmbios_uuid: {}\nrole: {role}\ncluster: lab\nprofile: vm\nrack: r1\ninterfaces:\n  - mac: \"{}\"\n    boot: true\ndisks:\n  - serial: D{}\n    type: ssd\n    size_bytes: 21474836480\n",
            m.name,
            m.uuid(),
            m.mac(),
            m.n
        ));
    }
    std::fs::write(inv.join("all.yaml"), doc).expect("write");
    inv
}

/// Take `m` through a reinstall up to stage `talos_api`: the install script, then the config
/// fetched from the node's own address. Returns the config it was served.
async fn boot_and_fetch(srv: &TestServer, w: &Workflows, m: &Spec) -> String {
    let (st, body) = post(
        srv,
        &srv.operator,
        &format!("/api/v1/machines/{}/reinstall", m.name),
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{}: {body}", m.name);
    w.tick().await.expect("tick");
    // The node asks for its script and its config from its own address, as a machine does (the
    // config token is bound to the address that asked for the script).
    let from = reqwest::Client::builder()
        .local_address(m.ip())
        .build()
        .expect("client");
    let script = from
        .get(srv.url(&format!(
            "/boot/machine.ipxe?mac={}&uuid={}&buildarch=x86_64&platform=efi",
            m.mac().replace(':', "-"),
            m.uuid()
        )))
        .answer()
        .await
        .text;
    let token = crate::talos_configs::token_of(&script);
    w.tick().await.expect("tick");
    let id = get(srv, &format!("/api/v1/machines/{}", m.name)).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let r = from
        .get(srv.url(&format!("/config/{id}?token={token}&uuid={}", m.uuid())))
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", m.name);
    let config = r.text;
    w.tick().await.expect("tick");
    let r = get(srv, &format!("/api/v1/machines/{}/reinstall", m.name)).await;
    assert_eq!(r["stage"], "talos_api", "{r}");
    assert_eq!(r["node_address"], m.ip().to_string());
    config
}

/// Stand-ins for the kernel and initramfs, so install scripts are served.
async fn images(srv: &TestServer, m: &Spec) {
    let schematic = get(srv, &format!("/api/v1/machines/{}/config", m.name)).await["schematic_id"]
        .as_str()
        .expect("schematic")
        .to_string();
    let cache = plinth::images::ImageCache::new(srv.data_dir.join("images"));
    let dir = tempfile::tempdir().expect("tmp");
    let k = dir.path().join("k");
    std::fs::write(&k, b"kernel").expect("k");
    for name in ["kernel-amd64", "initramfs-amd64.xz"] {
        cache
            .import(&schematic, "v1.12.11", name, &k)
            .expect("import");
    }
}

async fn ready(srv: &TestServer, m: &Spec) {
    images(srv, m).await;
    let (st, body) = post(
        srv,
        &srv.operator,
        &format!("/api/v1/machines/{}/state", m.name),
        json!({"state": "ready"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
}

/// Boot, fetch, start the node's Talos API with the served config, tick: installed.
async fn install(
    srv: &TestServer,
    w: &Workflows,
    m: &Spec,
    port: u16,
    cluster: &SharedCluster,
) -> TalosNode {
    let config = boot_and_fetch(srv, w, m).await;
    let node = TalosNode::start(
        std::net::SocketAddr::new(m.ip(), port),
        &config,
        NodeOptions::default(),
        cluster.clone(),
    )
    .await;
    w.tick().await.expect("tick");
    let r = get(srv, &format!("/api/v1/machines/{}/reinstall", m.name)).await;
    assert_eq!(r["stage"], "done", "{r}");
    let machine = get(srv, &format!("/api/v1/machines/{}", m.name)).await;
    assert_eq!(machine["state"], "installed", "{machine}");
    node
}

async fn events(srv: &TestServer, kind: &str) -> Vec<Value> {
    get(srv, &format!("/api/v1/events?kind={kind}&limit=500"))
        .await
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn verified_install_bootstraps_once_then_measures_health(b: Backend) {
    let port = free_port();
    let extra = extra(port);
    let srv = TestServer::start_with(b, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let machines = [CP1, CP2, CP3, W1];
    let inv = write_inventory(tmp.path(), &machines, "");
    apply_dir(&srv, &extra, &inv).await;
    for m in &machines {
        ready(&srv, m).await;
    }
    let w = services(&srv, &extra, "test-a").await;
    let etcd = SharedCluster::default();

    // The first control plane: installed (verified and recorded), then bootstrapped by the same
    // tick.
    let cp1 = install(&srv, &w, &CP1, port, &etcd).await;
    assert_eq!(cp1.bootstraps(), 1);
    let verified = events(&srv, "talos.verified").await;
    assert_eq!(verified.len(), 1, "{verified:?}");
    assert_eq!(verified[0]["detail"]["talos_version"], "v1.12.11");
    assert_eq!(
        verified[0]["detail"]["cert_sha256"],
        cp1.cert_sha256.as_str()
    );
    let done = events(&srv, "reinstall.done").await;
    assert_eq!(done[0]["detail"]["cert_sha256"], cp1.cert_sha256.as_str());
    let rec = get(&srv, "/api/v1/clusters/lab/bootstrap").await;
    assert_eq!(rec["state"], "done", "{rec}");
    assert_eq!(rec["node"], "cp-1");
    assert_eq!(rec["node_address"], CP1.ip().to_string());
    assert_eq!(rec["instance"], "test-a");
    assert_eq!(rec["requested_by"], "plinth");
    let claimed = events(&srv, "cluster.bootstrap_claimed").await;
    let bootstrapped = events(&srv, "cluster.bootstrapped").await;
    assert_eq!((claimed.len(), bootstrapped.len()), (1, 1));
    assert!(
        claimed[0]["id"].as_i64() < bootstrapped[0]["id"].as_i64(),
        "claimed before the call"
    );

    // A worker (its certificate from the control plane's trustd): nothing to bootstrap on it.
    let w1 = install(&srv, &w, &W1, port, &etcd).await;
    assert_eq!(w1.bootstraps(), 0);
    assert_eq!(events(&srv, "talos.verified").await.len(), 2);

    // The others join; more ticks never bootstrap again.
    let cp2 = install(&srv, &w, &CP2, port, &etcd).await;
    let cp3 = install(&srv, &w, &CP3, port, &etcd).await;
    for _ in 0..3 {
        w.tick().await.expect("tick");
    }
    assert_eq!(
        (cp1.bootstraps(), cp2.bootstraps(), cp3.bootstraps()),
        (1, 0, 0)
    );

    // By hand: refused, naming when, where and by which instance (409; the CLI exits non-zero).
    let (st, body) = post(
        &srv,
        &srv.admin,
        "/api/v1/clusters/lab/bootstrap",
        json!({"node": "cp-2"}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    assert!(
        body.contains("already_bootstrapped") && body.contains("cp-1") && body.contains("test-a"),
        "{body}"
    );
    let (st, _) = post(
        &srv,
        &srv.operator,
        "/api/v1/clusters/lab/bootstrap",
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "admins only");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args([
            "cluster",
            "bootstrap",
            "lab",
            "--server",
            &srv.base,
            "--token",
            &srv.admin,
        ])
        .output()
        .expect("plinth");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("was bootstrapped on node cp-1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Health: every node up, three healthy members, quorum 2, one control plane may go.
    let h = get(&srv, "/api/v1/clusters/lab/health").await;
    assert_eq!(h["nodes_up"], 4, "{h}");
    assert_eq!(
        h["etcd"]["members"].as_array().map(Vec::len),
        Some(3),
        "{h}"
    );
    assert_eq!(h["etcd"]["healthy_members"], 3);
    assert_eq!(h["etcd"]["quorum"], 2);
    assert_eq!(h["etcd"]["quorum_margin"], 1);
    assert_eq!(h["etcd"]["leader_hostname"], "cp-1");
    assert_eq!(h["talos_check"]["passed"], true, "{h}");
    for n in h["nodes"].as_array().expect("nodes") {
        assert_eq!(n["talos_version"], "v1.12.11", "{n}");
        let ids: Vec<&str> = n["services"]
            .as_array()
            .expect("services")
            .iter()
            .filter_map(|s| s["id"].as_str())
            .collect();
        assert!(ids.contains(&"kubelet") && ids.contains(&"apid"), "{ids:?}");
        if n["role"] == "control-plane" {
            assert!(ids.contains(&"etcd") && ids.contains(&"trustd"), "{ids:?}");
        }
    }
    let cached = get(&srv, "/api/v1/clusters/lab/health?cached=true").await;
    assert_eq!(
        cached["checked_at"], h["checked_at"],
        "stored with its time"
    );
    let metrics = srv.client.get(srv.url("/metrics")).answer().await.text;
    // The server's gauges follow its last measurement (the GET above).
    for line in [
        "plinth_cluster_nodes_up{cluster=\"lab\"} 4",
        "plinth_cluster_etcd_members_healthy{cluster=\"lab\"} 3",
        "plinth_cluster_quorum_margin{cluster=\"lab\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }

    // A reinstall of a control plane never bootstraps again.
    drop(cp2);
    let cp2 = install(&srv, &w, &CP2, port, &etcd).await;
    w.tick().await.expect("tick");
    assert_eq!((cp1.bootstraps(), cp2.bootstraps()), (1, 0));
    assert_eq!(events(&srv, "cluster.bootstrap_claimed").await.len(), 1);

    // One control plane down: the measured margin is 0, so no other control plane may go.
    drop(cp3);
    let h = get(&srv, "/api/v1/clusters/lab/health").await;
    assert_eq!(h["etcd"]["healthy_members"], 2, "{h}");
    assert_eq!(h["etcd"]["quorum_margin"], 0, "{h}");
    let (st, body) = post(
        &srv,
        &srv.operator,
        "/api/v1/machines/cp-2/reinstall",
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    assert!(
        body.contains("would lose quorum") && body.contains("margin 0"),
        "{body}"
    );
    // cp-3 itself is not a healthy member: reinstalling it loses nothing.
    let (st, body) = post(
        &srv,
        &srv.operator,
        "/api/v1/machines/cp-3/reinstall",
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    drop((cp1, cp2, w1));
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_install_bootstraps_once_then_measures_health_sqlite() {
    verified_install_bootstraps_once_then_measures_health(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_install_bootstraps_once_then_measures_health_postgres() {
    verified_install_bootstraps_once_then_measures_health(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_certificate_or_another_version_on_50000_fails_the_install() {
    let port = free_port();
    let extra = extra(port);
    let srv = TestServer::start_with(Backend::Sqlite, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let inv = write_inventory(tmp.path(), &[CP1, CP2], "bootstrap: manual\n");
    apply_dir(&srv, &extra, &inv).await;
    let w = services(&srv, &extra, "test-f").await;
    for (m, opts, want) in [
        (
            CP1,
            NodeOptions {
                foreign: true,
                ..Default::default()
            },
            "not trusted",
        ),
        (
            CP2,
            NodeOptions {
                version: Some("v1.12.10".into()),
                ..Default::default()
            },
            "runs Talos v1.12.10, but cluster lab declares v1.12.11",
        ),
    ] {
        ready(&srv, &m).await;
        let config = boot_and_fetch(&srv, &w, &m).await;
        let node = TalosNode::start(
            std::net::SocketAddr::new(m.ip(), port),
            &config,
            opts,
            SharedCluster::default(),
        )
        .await;
        w.tick().await.expect("tick");
        let r = get(&srv, &format!("/api/v1/machines/{}/reinstall", m.name)).await;
        assert_eq!(r["stage"], "failed", "{r}");
        let machine = get(&srv, &format!("/api/v1/machines/{}", m.name)).await;
        assert_eq!(machine["state"], "failed");
        let reason = machine["state_reason"].as_str().unwrap_or("");
        assert!(
            reason.contains("stage talos_api") && reason.contains(want),
            "{reason}"
        );
        assert_eq!(node.bootstraps(), 0);
    }
    assert!(events(&srv, "talos.verified").await.is_empty());
    srv.finish().await;
}

/// Two Plinth instances on one PostgreSQL bootstrap the same cluster at the same moment: the
/// claim's primary key lets exactly one call the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_race_to_bootstrap_and_exactly_one_does() {
    let port = free_port();
    let extra = extra(port);
    let srv = TestServer::start_with(Backend::Postgres, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let inv = write_inventory(tmp.path(), &[CP1, CP2], "bootstrap: manual\n");
    apply_dir(&srv, &extra, &inv).await;
    let a = services(&srv, &extra, "instance-a").await;
    let b = services(&srv, &extra, "instance-b").await;
    let etcd = SharedCluster::default();
    ready(&srv, &CP1).await;
    ready(&srv, &CP2).await;
    let cp1 = install(&srv, &a, &CP1, port, &etcd).await;
    let cp2 = install(&srv, &b, &CP2, port, &etcd).await;
    assert_eq!(
        cp1.bootstraps() + cp2.bootstraps(),
        0,
        "manual: nobody bootstraps on their own"
    );
    // The node answers slowly, so both claims meet.
    cp1.delay("Bootstrap", 5, Duration::from_millis(500));
    cp2.delay("Bootstrap", 5, Duration::from_millis(500));
    for round in 0..3 {
        let (ra, rb, ta, tb) = tokio::join!(
            a.clusters().bootstrap("lab", Some("cp-1"), "token:alice"),
            b.clusters().bootstrap("lab", Some("cp-2"), "token:bob"),
            a.tick(),
            b.tick(),
        );
        ta.expect("tick a");
        tb.expect("tick b");
        let ok = [&ra, &rb].iter().filter(|r| r.is_ok()).count();
        if round == 0 {
            assert_eq!(ok, 1, "exactly one: {ra:?} {rb:?}");
        } else {
            assert_eq!(ok, 0);
        }
        for r in [ra, rb] {
            if let Err(e) = r {
                assert!(matches!(e, BootstrapError::Already(_)), "{e}");
            }
        }
    }
    assert_eq!(cp1.bootstraps() + cp2.bootstraps(), 1);
    let bootstrap_calls = cp1
        .calls()
        .iter()
        .chain(cp2.calls().iter())
        .filter(|(m, _)| m.ends_with("/Bootstrap"))
        .count();
    assert_eq!(bootstrap_calls, 1, "the loser never called a node");
    assert_eq!(events(&srv, "cluster.bootstrap_claimed").await.len(), 1);
    srv.finish().await;
}

/// Plinth stops in the middle of the Bootstrap call (the claim is committed, the answer never
/// comes): the next instance never calls again, automatically or by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_call_never_bootstraps_a_second_time() {
    let port = free_port();
    let extra = extra(port);
    let srv = TestServer::start_with(Backend::Sqlite, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let inv = write_inventory(tmp.path(), &[CP1], "bootstrap: manual\n");
    apply_dir(&srv, &extra, &inv).await;
    let first = services(&srv, &extra, "before-restart").await;
    let etcd = SharedCluster::default();
    ready(&srv, &CP1).await;
    let cp1 = install(&srv, &first, &CP1, port, &etcd).await;
    cp1.delay("Bootstrap", 1, Duration::from_secs(30));
    let c = first.clusters().clone();
    let call = tokio::spawn(async move { c.bootstrap("lab", None, "token:alice").await });
    // Wait for the claim and the call to reach the node, then "kill" this instance.
    for _ in 0..100 {
        if cp1.calls().iter().any(|(m, _)| m.ends_with("/Bootstrap")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    call.abort();
    let _ = call.await;
    drop(first);
    let rec = get(&srv, "/api/v1/clusters/lab/bootstrap").await;
    assert_eq!(rec["state"], "calling", "recorded before the call: {rec}");
    assert_eq!(rec["instance"], "before-restart");

    let after = services(&srv, &extra, "after-restart").await;
    // The cluster now asks for automatic bootstraps: still nothing, the claim stands.
    let text = std::fs::read_to_string(inv.join("all.yaml")).expect("inv");
    std::fs::write(
        inv.join("all.yaml"),
        text.replace("bootstrap: manual\n", ""),
    )
    .expect("write");
    apply_dir(&srv, &extra, &inv).await;
    for _ in 0..3 {
        after.tick().await.expect("tick");
    }
    let e = after
        .clusters()
        .bootstrap("lab", Some("cp-1"), "token:bob")
        .await
        .expect_err("by hand");
    assert!(
        e.to_string().contains("unknown outcome") && e.to_string().contains("before-restart"),
        "{e}"
    );
    let calls = cp1
        .calls()
        .iter()
        .filter(|(m, _)| m.ends_with("/Bootstrap"))
        .count();
    assert_eq!(calls, 1, "no second attempt");
    srv.finish().await;
}

fn openssl_x509(pem_b64: &str, dir: &Path, name: &str) -> String {
    use base64::Engine as _;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(pem_b64)
        .expect("base64");
    let path = dir.join(name);
    std::fs::write(&path, pem).expect("write");
    let out = std::process::Command::new("openssl")
        .args([
            "x509",
            "-noout",
            "-subject",
            "-enddate",
            "-ext",
            "extendedKeyUsage",
            "-in",
        ])
        .arg(&path)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn not_after(openssl: &str) -> chrono::DateTime<chrono::Utc> {
    let line = openssl
        .lines()
        .find_map(|l| l.strip_prefix("notAfter="))
        .expect("notAfter");
    chrono::NaiveDateTime::parse_from_str(line.trim_end_matches(" GMT"), "%b %e %H:%M:%S %Y")
        .expect("date")
        .and_utc()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talosconfig_and_kubeconfig_for_admins_with_roles_and_expiry() {
    let port = free_port();
    let extra = extra(port);
    let srv = TestServer::start_with(Backend::Sqlite, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let inv = write_inventory(tmp.path(), &[CP1], "bootstrap: manual\n");
    apply_dir(&srv, &extra, &inv).await;
    let w = services(&srv, &extra, "test-c").await;
    ready(&srv, &CP1).await;
    let cp1 = install(&srv, &w, &CP1, port, &SharedCluster::default()).await;

    let (st, _) = post(
        &srv,
        &srv.operator,
        "/api/v1/clusters/lab/talosconfig",
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _) = post(
        &srv,
        &srv.operator,
        "/api/v1/clusters/lab/kubeconfig",
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);

    // Through the CLI, as a person would: `> talosconfig`.
    let now = chrono::Utc::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args([
            "cluster",
            "talosconfig",
            "lab",
            "--role",
            "os:reader",
            "--ttl",
            "2h",
            "--server",
            &srv.base,
            "--token",
            &srv.admin,
        ])
        .output()
        .expect("plinth");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).expect("talosconfig YAML");
    assert_eq!(t["context"].as_str(), Some("lab"));
    let ctx = &t["contexts"]["lab"];
    assert_eq!(
        ctx["endpoints"][0].as_str(),
        Some(CP1.ip().to_string().as_str())
    );
    let x = openssl_x509(ctx["crt"].as_str().expect("crt"), tmp.path(), "talos.crt");
    assert!(
        x.contains("O=os:reader") || x.contains("O = os:reader"),
        "{x}"
    );
    assert!(x.contains("TLS Web Client Authentication"), "{x}");
    let exp = not_after(&x);
    assert!(
        (exp - (now + chrono::Duration::hours(2)))
            .num_seconds()
            .abs()
            < 120,
        "expires in 2 h: {exp}"
    );
    // The talosconfig works against the node, with the reader's rights only.
    use base64::Engine as _;
    let b64 = |k: &str| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(ctx[k].as_str().expect(k))
                .expect("b64"),
        )
        .expect("utf8")
    };
    let creds = plinth::service::ports::talos_api::TalosCredentials {
        ca_pem: b64("ca"),
        cert_pem: b64("crt"),
        key_pem: b64("key"),
        role: "os:reader".into(),
        expires_at: exp,
    };
    use plinth::service::ports::talos_api::TalosApi;
    let node = plinth::service::ports::talos_api::TalosNode {
        endpoint: cp1.addr,
        credentials: Arc::new(creds),
    };
    let api = plinth::talos_api::TalosApiClient::default();
    assert_eq!(api.version(&node).await.expect("version").tag, "v1.12.11");
    let e = api
        .bootstrap(&node, Default::default())
        .await
        .expect_err("reader");
    assert!(e.cause.contains("not authorized"), "{e}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args([
            "cluster",
            "kubeconfig",
            "lab",
            "--ttl",
            "8h",
            "--server",
            &srv.base,
            "--token",
            &srv.admin,
        ])
        .output()
        .expect("plinth");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let k: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).expect("kubeconfig YAML");
    assert_eq!(k["current-context"].as_str(), Some("admin@lab"));
    assert_eq!(
        k["clusters"][0]["cluster"]["server"].as_str(),
        Some("https://10.88.0.10:6443")
    );
    let x = openssl_x509(
        k["users"][0]["user"]["client-certificate-data"]
            .as_str()
            .expect("crt"),
        tmp.path(),
        "kube.crt",
    );
    assert!(
        x.contains("system:masters") && x.contains("CN=admin") || x.contains("CN = admin"),
        "{x}"
    );
    let exp = not_after(&x);
    assert!(
        (exp - (now + chrono::Duration::hours(8)))
            .num_seconds()
            .abs()
            < 120,
        "{exp}"
    );

    // Each is an event naming who asked; no key in it.
    for kind in ["cluster.talosconfig", "cluster.kubeconfig"] {
        let ev = events(&srv, kind).await;
        assert_eq!(ev.len(), 1, "{kind}: {ev:?}");
        assert!(
            ev[0]["actor"].as_str().unwrap_or("").starts_with("token:"),
            "{ev:?}"
        );
        assert!(!ev[0].to_string().contains("PRIVATE"), "{ev:?}");
    }
    // Too long is refused.
    let (st, body) = post(
        &srv,
        &srv.admin,
        "/api/v1/clusters/lab/talosconfig",
        json!({"ttl_seconds": 40 * 86400}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
    let (st, body) = post(
        &srv,
        &srv.admin,
        "/api/v1/clusters/lab/talosconfig",
        json!({"role": "root"}),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    srv.finish().await;
}

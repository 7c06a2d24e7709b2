//! Rolling Talos upgrades (issue #20) against Plinth and a cluster of Talos API stand-ins on
//! loopback addresses (3 control planes, 4 workers in two racks; `support::talos_node`, whose
//! nodes reboot, change version, fail, never come back or roll back as asked): the plan and the
//! pre-checks that refuse, the order (control planes one at a time with the etcd leader last,
//! then workers at most `maxWorkersPerRack` of each rack at once) read off the nodes' own record
//! of going down and coming up, both upgrade calls (`MachineService.Upgrade` before 1.13,
//! `ImageService.Pull` + `LifecycleService.Upgrade` + `Reboot` after), the inventory following
//! the upgrade, a node that fails or rolls back stopping the rollout, a Plinth killed with
//! kill -9 mid-rollout resuming without repeating a node, and two instances on one PostgreSQL
//! never running two rollouts.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::talos_node::{NodeOptions, SharedCluster, TalosNode, UpgradeFault};
use crate::support::{self, free_port, Ask as _, Backend, TestServer};
use crate::talos_configs::{apply_dir, schemas};

/// One machine of the lab.
#[derive(Clone, Copy)]
struct Spec {
    name: &'static str,
    cp: bool,
    rack: &'static str,
    n: u8,
}

impl Spec {
    fn ip(&self, net: u8) -> IpAddr {
        format!("127.0.{net}.{}", self.n).parse().expect("ip")
    }
}

const LAB: [Spec; 7] = [
    Spec {
        name: "cp-1",
        cp: true,
        rack: "r1",
        n: 1,
    },
    Spec {
        name: "cp-2",
        cp: true,
        rack: "r1",
        n: 2,
    },
    Spec {
        name: "cp-3",
        cp: true,
        rack: "r2",
        n: 3,
    },
    Spec {
        name: "w-1",
        cp: false,
        rack: "r1",
        n: 4,
    },
    Spec {
        name: "w-2",
        cp: false,
        rack: "r1",
        n: 5,
    },
    Spec {
        name: "w-3",
        cp: false,
        rack: "r1",
        n: 6,
    },
    Spec {
        name: "w-4",
        cp: false,
        rack: "r2",
        n: 7,
    },
];

/// The server's config: the engine ticks itself rarely (the upgrade driver has its own pace).
pub(crate) fn extra(port: u16) -> String {
    format!(
        "[talos]\nschema_dir = \"{}\"\n[workflows]\ntick_seconds = 3600\ntalos_api_port = {port}\nhealth_seconds = 3600\n[upgrades]\npoll_seconds = 1\nlease_seconds = 3\n",
        schemas().display()
    )
}

/// The inventory: cluster `lab` on v1.12.11 with its upgrade policy and etcd snapshots kept in
/// the directory `dir/snapshots`, seven machines (their Talos API answers on
/// `127.0.{net}.0/24`, recorded when each install is verified).
pub(crate) fn write_inventory(dir: &Path, net: u8, upgrade: &str) -> PathBuf {
    write_inventory_with(dir, net, upgrade, true)
}

/// `write_inventory`, with or without `etcdSnapshots` (the secrets bundle is written once).
fn write_inventory_with(dir: &Path, net: u8, upgrade: &str, snapshots: bool) -> PathBuf {
    let inv = dir.join("inv");
    std::fs::create_dir_all(&inv).expect("mkdir");
    let secrets = dir.join("secrets.yaml");
    if !secrets.exists() {
        std::fs::write(
            &secrets,
            plinth::talos::secrets::SecretsBundle::generate()
                .expect("bundle")
                .to_yaml()
                .expect("yaml"),
        )
        .expect("secrets");
    }
    let policy = if snapshots {
        format!(
            "etcdSnapshots: {{every: 6h, keep: 3, store: \"file://{}\"}}\n",
            dir.join("snapshots").display()
        )
    } else {
        String::new()
    };
    let mut doc = format!(
        "kind: Cluster\nname: lab\nendpoint: https://10.88.0.10:6443\ntalosVersion: v1.12.11\nsecrets: {}\nbootstrap: manual\n{policy}upgrade:\n{upgrade}---\nkind: Profile\nname: vm\ninstallDisk:\n  type: ssd\n",
        secrets.display()
    );
    for m in LAB {
        let role = if m.cp { "control-plane" } else { "worker" };
        doc.push_str(&format!(
            "---\nkind: Machine\nhostname: {}\nsmbios_uuid: 5b6c2a1e-8f3d-4c2b-9a7e-0d1f2e3c{net:02x}{:02x}\nrole: {role}\ncluster: lab\nprofile: vm\nrack: {}\ninterfaces:\n  - mac: \"52:54:00:20:{net:02x}:{:02x}\"\n    boot: true\ndisks:\n  - serial: D{}\n    type: ssd\n    size_bytes: 21474836480\n",
            m.name,
            m.n,
            m.rack,
            m.n,
            m.n
        ));
    }
    std::fs::write(inv.join("all.yaml"), doc).expect("write");
    inv
}

/// The library's use cases over a server's database (as `app` wires them).
pub(crate) struct Library {
    configs: plinth::service::ConfigService,
    inventory: plinth::service::Inventory,
    clusters: plinth::service::clusters::Clusters,
    pub(crate) upgrades: plinth::service::Upgrades,
    snapshots: plinth::service::snapshots::Snapshots,
}

pub(crate) async fn library(db: &support::TestDb, extra: &str, instance: &str) -> Library {
    let cfg = support::config(db, extra);
    let store = plinth::app::open_store(&cfg, false).await.expect("store");
    let secrets = plinth::app::secret_box(&cfg).expect("key");
    let configs = plinth::app::config_service(&store, secrets.clone(), Some(schemas()));
    let inventory = plinth::app::inventory(&store, secrets);
    let clusters = plinth::app::clusters(
        &configs,
        &store,
        Arc::new(plinth::talos_api::TalosApiClient::default()),
        plinth::service::clusters::ClusterSettings {
            talos_api_port: cfg.workflows.talos_api_port,
            health_wait: Duration::from_secs(3),
            instance: instance.into(),
            ..Default::default()
        },
    );
    // The snapshot pre-check reads, and a rollout takes, real snapshots (a directory store).
    let snapshots = plinth::app::snapshots(
        &clusters,
        &store,
        cfg.snapshot_s3.clone(),
        plinth::app::secret_box(&cfg).expect("key"),
        plinth::service::snapshots::SnapshotSettings {
            instance: instance.into(),
            turn: cfg.snapshot_turn,
            ..Default::default()
        },
    );
    let upgrades = plinth::app::upgrades(
        &clusters,
        &store,
        Arc::new(snapshots.clone()),
        plinth::service::UpgradeSettings {
            instance: instance.into(),
            ..cfg.upgrades.clone()
        },
    );
    Library {
        configs,
        inventory,
        clusters,
        upgrades,
        snapshots,
    }
}

/// An admin token minted by the CLI over the database of `cfg`.
fn admin_token(dir: &Path, cfg: &str) -> String {
    let (code, token, err) = crate::cli::plinth(
        dir,
        &["--config", cfg, "token", "create", "--role", "admin"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    token.trim().to_string()
}

/// Apply the inventory directory `inv` through the library, as `plinth apply` does.
async fn apply_lib(lib: &Library, inv: &Path) {
    let declared = plinth::declare::load(inv).expect("directory loads");
    let r = plinth::service::apply::apply(&lib.configs, &lib.inventory, declared, false, "test")
        .await
        .expect("apply");
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

/// The lab's nodes, by name, sharing one etcd.
pub(crate) struct Nodes {
    etcd: SharedCluster,
    nodes: Vec<(Spec, TalosNode)>,
}

impl Nodes {
    pub(crate) fn get(&self, name: &str) -> &TalosNode {
        &self
            .nodes
            .iter()
            .find(|(s, _)| s.name == name)
            .expect("node")
            .1
    }

    fn timeline(&self) -> Vec<String> {
        self.etcd.lock().expect("etcd").timeline.clone()
    }

    fn max_cps_down(&self) -> usize {
        self.etcd.lock().expect("etcd").max_cps_down
    }
}

/// Put every machine in `installed` (as a person adopting an installed cluster does), start its
/// Talos API with the config Plinth renders for it, verify it there (as a reinstall's last stage
/// does: its address is recorded), bootstrap etcd on cp-1 and wait until every member is
/// healthy.
pub(crate) async fn bring_up(
    base: &str,
    admin: &str,
    lib: &Library,
    port: u16,
    net: u8,
    reboot_ms: u64,
) -> Nodes {
    let http = reqwest::Client::new();
    for m in LAB {
        for state in ["maintenance", "installed"] {
            let r = http
                .post(format!("{base}/api/v1/machines/{}/state", m.name))
                .bearer_auth(admin)
                .json(&json!({"state": state}))
                .answer()
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}: {}", m.name, r.text);
        }
    }
    let etcd = SharedCluster::default();
    let mut nodes = Vec::new();
    // Control planes first: workers get their certificates from a control plane's trustd.
    for m in LAB {
        let machine = lib.inventory.resolve(m.name).await.expect("machine");
        let rendered = lib.configs.render_machine(&machine).await.expect("render");
        let node = TalosNode::start(
            SocketAddr::new(m.ip(net), port),
            &rendered.yaml,
            NodeOptions {
                reboot_ms,
                ..Default::default()
            },
            etcd.clone(),
        )
        .await;
        let v = lib
            .clusters
            .verify_install(&machine, &m.ip(net).to_string())
            .await
            .expect("verify");
        assert!(
            matches!(v, plinth::service::clusters::Verification::Verified(_)),
            "{}: {v:?}",
            m.name
        );
        nodes.push((m, node));
    }
    let r = http
        .post(format!("{base}/api/v1/clusters/lab/bootstrap"))
        .bearer_auth(admin)
        .json(&json!({"node": "cp-1"}))
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let h = http
            .get(format!("{base}/api/v1/clusters/lab/health"))
            .bearer_auth(admin)
            .answer()
            .await
            .json();
        if h["etcd"]["healthy_members"] == 3 && h["nodes_up"] == 7 {
            break;
        }
        assert!(Instant::now() < until, "the lab never got healthy: {h}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Nodes { etcd, nodes }
}

pub(crate) async fn status(base: &str, token: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{base}/api/v1/clusters/lab/upgrade"))
        .bearer_auth(token)
        .answer()
        .await
        .json()
}

/// Wait until the rollout is in `state` (failing early if it ended otherwise).
async fn wait_rollout(base: &str, token: &str, state: &str, secs: u64) -> Value {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = status(base, token).await;
        let now = s["rollout"]["state"].as_str().unwrap_or("").to_string();
        if now == state {
            return s;
        }
        assert!(
            now == "running" || now == "paused" || now.is_empty(),
            "the rollout ended {now}, not {state}: {s}"
        );
        assert!(Instant::now() < until, "rollout not {state} in time: {s}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Replay the nodes' record: at no moment were more than `cps` control planes, or more than
/// `per_rack` workers of one rack, down; the control planes went first, one at a time.
fn check_order(timeline: &[String], per_rack: usize, leader: &str) {
    let spec = |name: &str| LAB.iter().find(|s| s.name == name).copied().expect("spec");
    let mut down: Vec<Spec> = Vec::new();
    let mut cps_done = 0;
    let mut cp_order = Vec::new();
    for e in timeline {
        let mut parts = e.split_whitespace();
        let (what, name) = (parts.next().expect("what"), parts.next().expect("name"));
        let s = spec(name);
        if what == "down" {
            if s.cp {
                cp_order.push(name.to_string());
                assert_eq!(
                    cps_done,
                    cp_order.len() - 1,
                    "one control plane at a time: {timeline:?}"
                );
            } else {
                assert_eq!(
                    cps_done, 3,
                    "workers only after every control plane: {timeline:?}"
                );
            }
            down.push(s);
            assert!(down.iter().filter(|d| d.cp).count() <= 1, "{timeline:?}");
            for rack in ["r1", "r2"] {
                assert!(
                    down.iter().filter(|d| !d.cp && d.rack == rack).count() <= per_rack,
                    "at most {per_rack} workers of {rack} down: {timeline:?}"
                );
            }
        } else {
            down.retain(|d| d.name != name);
            if s.cp {
                cps_done += 1;
            }
        }
    }
    assert_eq!(cp_order.len(), 3, "{timeline:?}");
    assert_eq!(
        cp_order.last().map(String::as_str),
        Some(leader),
        "the leader last"
    );
}

async fn events(base: &str, token: &str, kind: &str) -> Vec<Value> {
    reqwest::Client::new()
        .get(format!("{base}/api/v1/events?kind={kind}&limit=1000"))
        .bearer_auth(token)
        .answer()
        .await
        .json()
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn upgrades_in_order_then_lifecycle(b: Backend) {
    let port = free_port();
    let extra = extra(port);
    let srv = TestServer::start_with(b, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    // First without `etcdSnapshots`: no snapshot can be taken, so no rollout can start.
    let inv = write_inventory_with(tmp.path(), 20, "  maxWorkersPerRack: 2\n", false);
    apply_dir(&srv, &extra, &inv).await;
    let lib = library(&srv.db, &extra, "test-library").await;
    let lab = bring_up(&srv.base, &srv.admin, &lib, port, 20, 300).await;
    let schematic = lib.configs.sources().await.expect("sources").clusters["lab"]
        .spec
        .schematic_id
        .clone();
    let installer = format!("factory.talos.dev/metal-installer/{schematic}:v1.13.9");

    // The plan: the snapshot pre-check fails (no snapshot is recorded), the others pass; control planes one at a time, the leader (cp-1, which bootstrapped) last;
    // workers two of r1 and the one of r2, then the third of r1.
    let plan = srv
        .req(Method::POST, "/api/v1/clusters/lab/upgrade", &srv.operator)
        .json(&json!({"to": "v1.13.9", "dry_run": true}))
        .answer()
        .await
        .json();
    let checks: Vec<(String, bool)> = plan["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("").to_string(),
                c["passed"] == true,
            )
        })
        .collect();
    assert_eq!(
        checks,
        [
            ("upgrade path".to_string(), true),
            ("nodes healthy".to_string(), true),
            ("etcd quorum".to_string(), true),
            ("etcd snapshot".to_string(), false),
            ("no rollout running".to_string(), true),
        ],
        "{plan}"
    );
    let order: Vec<(String, u64, String, String)> = plan["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap_or("").to_string(),
                n["batch"].as_u64().unwrap_or(99),
                n["method"].as_str().unwrap_or("").to_string(),
                n["installer"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let expect = [
        ("cp-2", 0),
        ("cp-3", 1),
        ("cp-1", 2),
        ("w-1", 3),
        ("w-2", 3),
        ("w-4", 3),
        ("w-3", 4),
    ];
    assert_eq!(order.len(), expect.len(), "{plan}");
    for ((name, batch, method, image), (want, want_batch)) in order.iter().zip(expect) {
        assert_eq!((name.as_str(), *batch), (want, want_batch), "{plan}");
        assert_eq!(method, "machine", "v1.12 nodes get MachineService.Upgrade");
        assert_eq!(image, &installer);
    }
    // Starting it through the API is refused, naming the failed check; the CLI says the same.
    let r = srv
        .req(Method::POST, "/api/v1/clusters/lab/upgrade", &srv.admin)
        .json(&json!({"to": "v1.13.9"}))
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(
        r.text.contains("upgrade_refused")
            && r.text.contains("pre-check `etcd snapshot` failed")
            && r.text.contains("the snapshot taken for the rollout failed")
            && r.text.contains("declares no etcdSnapshots"),
        "{}",
        r.text
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args([
            "cluster", "upgrade", "lab", "--to", "v1.13.9", "--server", &srv.base, "--token",
            &srv.admin,
        ])
        .output()
        .expect("plinth");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("etcd snapshot"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Operators may plan, not start; skipping a minor release and downgrading are refused.
    let r = srv
        .req(Method::POST, "/api/v1/clusters/lab/upgrade", &srv.operator)
        .json(&json!({"to": "v1.13.9"}))
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    for (to, why) in [
        ("v1.14.1", "skips a minor release"),
        ("v1.11.6", "downgrade"),
    ] {
        let plan = lib.upgrades.plan("lab", to, None).await.expect("plan");
        let path = &plan.checks[0];
        assert!(!path.passed && path.detail.contains(why), "{to}: {path:?}");
    }

    // Every step is an event on the live feed.
    let feed = srv
        .req(
            Method::GET,
            "/api/v1/events/stream?kind=upgrade.",
            &srv.viewer,
        )
        .send()
        .await
        .expect("the stream opens");
    assert_eq!(feed.status(), StatusCode::OK);
    let mut feed = feed.bytes_stream();

    // With `etcdSnapshots` declared, starting it takes and verifies a snapshot first (into the
    // directory store on disk), then the server's driver runs it to the end.
    let inv = write_inventory_with(tmp.path(), 20, "  maxWorkersPerRack: 2\n", true);
    apply_dir(&srv, &extra, &inv).await;
    let r = srv
        .req(Method::POST, "/api/v1/clusters/lab/upgrade", &srv.admin)
        .json(&json!({"to": "v1.13.9"}))
        .answer()
        .await;
    assert!(r.status.is_success(), "{}: {}", r.status, r.text);
    let started = r.json();
    assert_eq!(
        started["rollout"]["installer"],
        installer.as_str(),
        "{started}"
    );
    let snaps = lib.snapshots.list("lab", 10).await.expect("snapshots");
    assert_eq!(snaps.len(), 1, "one snapshot, taken for the rollout");
    assert_eq!(snaps[0].state.as_str(), "verified");
    assert_eq!(snaps[0].requested_by, "token:test-admin");
    assert_eq!(
        started["rollout"]["snapshot"]["id"],
        snaps[0].id.to_string().as_str(),
        "the rollout records the snapshot it started from"
    );
    assert!(
        tmp.path()
            .join("snapshots")
            .join(&snaps[0].object)
            .is_file(),
        "the sealed snapshot is in the directory store"
    );
    let streamed: Vec<(u64, String)> = lab.nodes.iter().flat_map(|(_, n)| n.snapshots()).collect();
    assert_eq!(streamed.len(), 1, "one node streamed it once");
    assert_eq!(Some(streamed[0].1.clone()), snaps[0].sha256);
    let done = wait_rollout(&srv.base, &srv.viewer, "done", 180).await;
    for n in done["nodes"].as_array().expect("nodes") {
        assert_eq!(n["step"], "done", "{n}");
    }
    for (s, node) in &lab.nodes {
        assert_eq!(node.version(), "v1.13.9", "{}", s.name);
        assert_eq!(
            node.upgrades(),
            [("MachineService.Upgrade".to_string(), installer.clone())],
            "{}: one upgrade call",
            s.name
        );
    }
    assert_eq!(lab.max_cps_down(), 1, "{:?}", lab.timeline());
    check_order(&lab.timeline(), 2, "cp-1");
    for kind in [
        "upgrade.node_started",
        "upgrade.node_called",
        "upgrade.node_rebooted",
        "upgrade.node_done",
    ] {
        assert_eq!(
            events(&srv.base, &srv.viewer, kind).await.len(),
            7,
            "{kind}"
        );
    }
    assert_eq!(
        events(&srv.base, &srv.viewer, "upgrade.done").await.len(),
        1
    );
    let mut seen = String::new();
    while !seen.contains("event: upgrade.done") {
        use futures::StreamExt as _;
        let chunk = tokio::time::timeout(Duration::from_secs(20), feed.next())
            .await
            .expect("the feed goes on")
            .expect("open")
            .expect("bytes");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let kinds: Vec<&str> = seen
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(kinds.first(), Some(&"upgrade.started"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"upgrade.done"), "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "upgrade.node_done").count(),
        7,
        "{kinds:?}"
    );
    drop(feed);
    // The inventory follows: a later install installs v1.13.9.
    let sources = lib.configs.sources().await.expect("sources");
    assert_eq!(sources.clusters["lab"].spec.talos_version, "v1.13.9");
    let w1 = lib.inventory.resolve("w-1").await.expect("w-1");
    let rendered = lib.configs.render_machine(&w1).await.expect("render");
    assert!(rendered.yaml.contains(&installer), "{}", rendered.yaml);
    // Applying the directory that still says v1.12.11 is refused, naming the version it holds.
    let declared = plinth::declare::load(&inv).expect("directory loads");
    let r = plinth::service::apply::apply(&lib.configs, &lib.inventory, declared, false, "test")
        .await
        .expect("apply");
    assert!(!r.applied, "{:?}", r.errors);
    assert!(
        r.errors.iter().any(|e| e
            .to_string()
            .contains("talosVersion v1.12.11 is older than v1.13.9")),
        "{:?}",
        r.errors
    );

    // Nodes on 1.13 get the image pulled, LifecycleService.Upgrade and a reboot.
    let next = format!("factory.talos.dev/metal-installer/{schematic}:v1.13.10");
    let plan = lib
        .upgrades
        .plan("lab", "v1.13.10", None)
        .await
        .expect("plan");
    assert!(plan.failed().is_empty(), "{plan:?}");
    assert!(plan.nodes.iter().all(|n| n.method.as_str() == "lifecycle"));
    lib.upgrades
        .start("lab", "v1.13.10", None, "token:test")
        .await
        .expect("start");
    wait_rollout(&srv.base, &srv.viewer, "done", 180).await;
    for (s, node) in &lab.nodes {
        assert_eq!(node.version(), "v1.13.10", "{}", s.name);
        assert_eq!(
            node.upgrades()[1..],
            [
                ("LifecycleService.Upgrade".to_string(), next.clone()),
                ("MachineService.Reboot".to_string(), String::new())
            ],
            "{}",
            s.name
        );
    }
    assert_eq!(lab.max_cps_down(), 1);
    drop(lab);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_in_order_then_lifecycle_sqlite() {
    upgrades_in_order_then_lifecycle(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_in_order_then_lifecycle_postgres() {
    upgrades_in_order_then_lifecycle(Backend::Postgres).await;
}

/// A node rolled back by Talos stops the rollout at once; a node that never comes back stops it
/// at its deadline (its batch mates finish, no further batch starts); pause, resume, abort.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_node_stops_the_rollout() {
    let port = free_port();
    let extra = extra(port);
    let srv = TestServer::start_with(Backend::Sqlite, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let inv = write_inventory(
        tmp.path(),
        21,
        "  maxWorkersPerRack: 2\n  nodeTimeoutSeconds: 20\n",
    );
    apply_dir(&srv, &extra, &inv).await;
    let lib = library(&srv.db, &extra, "test-library").await;
    let lab = bring_up(&srv.base, &srv.admin, &lib, port, 21, 200).await;

    // cp-2 comes back on v1.12.11: reported as Talos' A/B rollback; nothing else is touched.
    lab.get("cp-2")
        .set_upgrade_fault(Some(UpgradeFault::Rollback));
    lib.upgrades
        .start("lab", "v1.13.9", None, "token:test")
        .await
        .expect("start");
    let s = wait_rollout(&srv.base, &srv.viewer, "failed", 120).await;
    let cp2 = &s["nodes"][0];
    assert_eq!(
        (cp2["name"].as_str(), cp2["step"].as_str()),
        (Some("cp-2"), Some("rolled_back")),
        "{s}"
    );
    assert!(
        cp2["seen"].as_str().unwrap_or("").contains("A/B fallback"),
        "{cp2}"
    );
    assert!(
        s["rollout"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("cp-2"),
        "{s}"
    );
    for n in &s["nodes"].as_array().expect("nodes")[1..] {
        assert_eq!(n["step"], "pending", "{n}");
    }
    for name in ["cp-1", "cp-3", "w-1"] {
        assert!(lab.get(name).upgrades().is_empty(), "{name} never called");
    }
    assert_eq!(
        events(&srv.base, &srv.viewer, "upgrade.node_rolled_back")
            .await
            .len(),
        1
    );
    // Reinstalls wait while a rollout runs; this one ended.
    lab.get("cp-2").set_upgrade_fault(None);

    // w-1 never comes back: its batch mates (w-2, w-4) finish, w-3 never starts.
    lab.get("w-1")
        .set_upgrade_fault(Some(UpgradeFault::NeverBack));
    lib.upgrades
        .start("lab", "v1.13.9", None, "token:test")
        .await
        .expect("start again");
    // Pause while control planes go: the one in flight finishes, no further node starts.
    let r = srv
        .req(
            Method::POST,
            "/api/v1/clusters/lab/upgrade/pause",
            &srv.operator,
        )
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = srv
        .req(
            Method::POST,
            "/api/v1/machines/w-3/reinstall",
            &srv.operator,
        )
        .json(&json!({}))
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.text.contains("upgrade rollout"), "{}", r.text);
    let until = Instant::now() + Duration::from_secs(60);
    let paused = loop {
        let s = status(&srv.base, &srv.viewer).await;
        let flying = s["nodes"].as_array().expect("nodes").iter().any(|n| {
            ["upgrading", "rebooting", "verifying"].contains(&n["step"].as_str().unwrap_or(""))
        });
        if !flying && s["rollout"]["owner"].is_null() {
            break s;
        }
        assert!(Instant::now() < until, "{s}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(paused["rollout"]["state"], "paused");
    let moved = paused["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["step"] == "done")
        .count();
    assert!(
        moved <= 1,
        "a paused rollout starts no further node: {paused}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        status(&srv.base, &srv.viewer).await["nodes"],
        paused["nodes"],
        "still paused"
    );
    let r = srv
        .req(
            Method::POST,
            "/api/v1/clusters/lab/upgrade/resume",
            &srv.operator,
        )
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "admins resume");
    let r = srv
        .req(
            Method::POST,
            "/api/v1/clusters/lab/upgrade/resume",
            &srv.admin,
        )
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let s = wait_rollout(&srv.base, &srv.viewer, "failed", 180).await;
    let step = |name: &str| {
        s["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["name"] == name)
            .map(|n| {
                (
                    n["step"].as_str().unwrap_or("").to_string(),
                    n["seen"].as_str().unwrap_or("").to_string(),
                )
            })
            .expect("node")
    };
    let (w1, seen) = step("w-1");
    assert_eq!(w1, "failed", "{s}");
    assert!(
        seen.contains("deadline") && seen.contains("not answering"),
        "{seen}"
    );
    assert_eq!(step("w-2").0, "done");
    assert_eq!(step("w-4").0, "done");
    assert_eq!(step("w-3").0, "pending", "the next batch never starts");
    assert!(lab.get("w-3").upgrades().is_empty());
    assert!(
        s["rollout"]["error"].as_str().unwrap_or("").contains("w-1"),
        "{s}"
    );
    // Abort needs an active rollout.
    let r = srv
        .req(
            Method::POST,
            "/api/v1/clusters/lab/upgrade/abort",
            &srv.admin,
        )
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    // The inventory did not follow a failed rollout.
    let sources = lib.configs.sources().await.expect("sources");
    assert_eq!(sources.clusters["lab"].spec.talos_version, "v1.12.11");
    drop(lab);
    srv.finish().await;
}

/// kill -9 of the Plinth driving a rollout, twice (a control plane rebooting, then a worker):
/// each restart takes it over once the lease ran out and finishes it; no node is called twice.
#[test]
fn kill_9_mid_rollout_resumes_without_repeating_a_node() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let port = free_port();
    let extra = extra(port);
    let db = rt.block_on(support::TestDb::new(Backend::Sqlite));
    let cfg_path = db.dir.path().join("plinth.toml");
    let key = db.dir.path().join("test.key");
    // The test's config writes the key; the server process migrates the database; the library
    // (this process) shares both.
    support::config(&db, &extra);
    std::fs::write(
        &cfg_path,
        format!(
            "data_dir = \"{}\"\n{extra}[database]\nurl = \"{}\"\n[secrets]\nkey_file = \"{}\"\n",
            db.dir.path().join("data").display(),
            db.url,
            key.display()
        ),
    )
    .expect("config");
    let cfg = cfg_path.display().to_string();
    let start = || {
        crate::cli::serve(
            db.dir.path(),
            &["--config", &cfg],
            &[("RUST_LOG", "info".to_string())],
        )
    };
    let mut srv = start();
    let lib = rt.block_on(library(&db, &extra, "test-library"));
    let token = admin_token(db.dir.path(), &cfg);
    let tmp = tempfile::tempdir().expect("tmp");
    let inv = write_inventory(tmp.path(), 22, "  maxWorkersPerRack: 2\n");
    rt.block_on(apply_lib(&lib, &inv));
    let lab = rt.block_on(bring_up(&srv.base, &token, &lib, port, 22, 1500));
    rt.block_on(lib.upgrades.start("lab", "v1.13.9", None, "token:test"))
        .expect("start");

    let mut logs = String::new();
    for (role, step) in [("control-plane", "rebooting"), ("worker", "rebooting")] {
        // Wait until a node of `role` is at `step`, then kill -9 the server.
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            let s = rt.block_on(status(&srv.base, &token));
            let hit = s["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|n| n["role"] == role && n["step"] == step);
            if hit {
                break;
            }
            assert!(s["rollout"]["state"] == "running", "{s}");
            assert!(Instant::now() < until, "no {role} {step}: {s}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let pid = srv.child.id();
        logs.push_str(&srv.log.lock().expect("log"));
        drop(srv); // SIGKILL by PID, then reaped
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        srv = start();
    }
    let done = rt.block_on(wait_rollout(&srv.base, &token, "done", 240));
    logs.push_str(&srv.log.lock().expect("log"));
    // The CLI: the rollout as JSON; the next plan (the snapshot taken for the rollout is fresh).
    let cli = |args: &[&str]| {
        let mut all = vec!["cluster", "upgrade", "lab"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--server", srv.base.as_str(), "--token", token.as_str()]);
        crate::cli::plinth(db.dir.path(), &all, &[])
    };
    let (code, out, err) = cli(&["--status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let json: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json["rollout"]["state"], "done", "{json}");
    assert_eq!(json["nodes"].as_array().map(Vec::len), Some(7));
    let (code, out, err) = cli(&["--to", "v1.13.10", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "pre-checks:",
        "[ok] upgrade path",
        "[ok] etcd snapshot",
        "LifecycleService.Upgrade",
        "cp-2",
        "w-4",
        "every pre-check passes",
    ] {
        assert!(out.contains(want), "{want} in:\n{out}");
    }
    let (code, _, err) = cli(&["--to", "v1.13.10", "--pause"]);
    assert_ne!(code, 0, "--to and --pause do not go together");
    assert!(err.contains("cannot be used with"), "{err}");
    for n in done["nodes"].as_array().expect("nodes") {
        assert_eq!(n["step"], "done", "{n}");
    }
    for (s, node) in &lab.nodes {
        assert_eq!(node.version(), "v1.13.9", "{}", s.name);
        assert_eq!(
            node.upgrades().len(),
            1,
            "{}: called once: {:?}",
            s.name,
            node.upgrades()
        );
    }
    let nodes_of = |kind: &str| {
        let e = rt.block_on(events(&srv.base, &token, kind));
        let mut names: Vec<String> = e
            .iter()
            .filter_map(|e| e["detail"]["node"].as_str().map(str::to_string))
            .collect();
        names.sort();
        names
    };
    for kind in [
        "upgrade.node_started",
        "upgrade.node_rebooted",
        "upgrade.node_done",
    ] {
        assert_eq!(
            nodes_of(kind),
            ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3", "w-4"],
            "{kind} once per node"
        );
    }
    // A call whose answer died with the server has no `node_called` (the node's new boot id
    // told the next server it went through); none has two.
    let mut called = nodes_of("upgrade.node_called");
    let n = called.len();
    called.dedup();
    assert_eq!(called.len(), n, "{called:?}");
    assert_eq!(lab.max_cps_down(), 1, "{:?}", lab.timeline());
    check_order(&lab.timeline(), 2, "cp-1");
    assert!(
        logs.matches("upgrade rollout: driving it").count() >= 3,
        "three servers drove it in turn:\n{logs}"
    );
    drop(srv);
    drop(lab);
    rt.block_on(db.drop_db());
}

/// Two Plinth instances on one PostgreSQL: two starts at once make one rollout; two drivers
/// never both drive it (each node is called once).
#[test]
fn two_instances_never_run_two_rollouts() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let port = free_port();
    let extra = extra(port);
    let db = rt.block_on(support::TestDb::new(Backend::Postgres));
    let key = db.dir.path().join("test.key");
    support::config(&db, &extra);
    let cfg_path = db.dir.path().join("plinth.toml");
    std::fs::write(
        &cfg_path,
        format!(
            "data_dir = \"{}\"\n{extra}[database]\nurl = \"{}\"\n[secrets]\nkey_file = \"{}\"\n",
            db.dir.path().join("data").display(),
            db.url,
            key.display()
        ),
    )
    .expect("config");
    let cfg = cfg_path.display().to_string();
    let serve = || {
        crate::cli::serve(
            db.dir.path(),
            &["--config", &cfg],
            &[("RUST_LOG", "info".to_string())],
        )
    };
    let one = serve();
    let two = serve();
    let a = rt.block_on(library(&db, &extra, "instance-a"));
    let b = rt.block_on(library(&db, &extra, "instance-b"));
    let token = admin_token(db.dir.path(), &cfg);
    let tmp = tempfile::tempdir().expect("tmp");
    let inv = write_inventory(tmp.path(), 23, "  maxWorkersPerRack: 1\n");
    rt.block_on(apply_lib(&a, &inv));
    let lab = rt.block_on(bring_up(&one.base, &token, &a, port, 23, 300));

    let (ra, rb) = rt.block_on(async {
        tokio::join!(
            a.upgrades.start("lab", "v1.13.9", None, "token:a"),
            b.upgrades.start("lab", "v1.13.9", None, "token:b")
        )
    });
    let oks = [ra.is_ok(), rb.is_ok()].iter().filter(|o| **o).count();
    assert_eq!(
        oks,
        1,
        "exactly one start: {:?} / {:?}",
        ra.as_ref().err(),
        rb.as_ref().err()
    );
    let refused = ra.err().or(rb.err()).expect("one refusal").to_string();
    // Both found no snapshot and raced to take one: the loser is refused by the snapshot
    // check (one instance at a time); or the winner's snapshot was fresh and the loser found
    // its rollout.
    assert!(
        refused.contains("active rollout")
            || refused.contains("no rollout running")
            || refused.contains("is being taken"),
        "{refused}"
    );
    let done = rt.block_on(wait_rollout(&two.base, &token, "done", 240));
    assert_eq!(done["nodes"].as_array().map(Vec::len), Some(7));
    for (s, node) in &lab.nodes {
        assert_eq!(
            node.upgrades().len(),
            1,
            "{}: called once: {:?}",
            s.name,
            node.upgrades()
        );
    }
    assert_eq!(
        rt.block_on(events(&one.base, &token, "upgrade.started"))
            .len(),
        1
    );
    assert_eq!(
        rt.block_on(events(&one.base, &token, "upgrade.node_started"))
            .len(),
        7
    );
    assert_eq!(lab.max_cps_down(), 1);
    check_order(&lab.timeline(), 1, "cp-1");
    drop((one, two, lab));
    rt.block_on(db.drop_db());
}

/// The cluster document's `upgrade:` policy: bad values and unknown keys are refused, naming
/// the file, the document and the field.
#[test]
fn the_upgrade_policy_is_checked_where_it_is_declared() {
    let tmp = tempfile::tempdir().expect("tmp");
    for (policy, want) in [
        (
            "  maxWorkersPerRack: 0\n",
            "upgrade.maxWorkersPerRack: must be at least 1",
        ),
        (
            "  nodeTimeoutSeconds: 1\n",
            "upgrade.nodeTimeoutSeconds: must be between 5 and 86400",
        ),
        (
            "  snapshotMaxAgeSeconds: 10\n",
            "upgrade.snapshotMaxAgeSeconds: must be between 60 and 604800",
        ),
        ("  maxWorkers: 2\n", "unknown field `maxWorkers`"),
    ] {
        let inv = write_inventory(tmp.path(), 24, policy);
        let errors = plinth::declare::load(&inv).expect_err("refused");
        let text = format!("{errors:?}");
        assert!(
            text.contains("all.yaml") && text.contains(want),
            "{policy}: {text}"
        );
    }
}

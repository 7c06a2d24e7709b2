//! Reinstall workflows against a running server on both backends: a reinstall without a BMC
//! followed stage by stage to `installed` (boot script, config fetch, Talos API), the live event
//! stream, a missed deadline failing the machine with the stage named and the automatic retries
//! stopping at the policy's maximum, and the scheduler's safety rules (three failed control planes
//! are reinstalled one at a time; one worker per rack).
//!
//! The engine runs on its own every `[workflows] tick_seconds`; these tests set that to an hour
//! and call `tick` themselves, so every step is deterministic.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{self, Ask as _, Backend, TestServer};
use crate::talos_configs::{
    apply_dir, boot_script, fetch, schemas, token_of, write_inventory, UUID,
};
use plinth::service::Workflows;

fn extra(port: u16, netboot_seconds: u64) -> String {
    format!(
        "[talos]\nschema_dir = \"{}\"\n[workflows]\ntick_seconds = 3600\nnetboot_seconds = {netboot_seconds}\ntalos_api_port = {port}\n",
        schemas().display()
    )
}

async fn workflows(srv: &TestServer, extra: &str) -> Workflows {
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
        Arc::new(plinth::talos_api::TalosApiClient::default()),
        plinth::service::clusters::ClusterSettings {
            talos_api_port: cfg.workflows.talos_api_port,
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
    srv.req(Method::GET, path, &srv.viewer)
        .answer()
        .await
        .json()
}

async fn post(srv: &TestServer, path: &str, body: Value) -> (StatusCode, Value) {
    let r = srv
        .req(Method::POST, path, &srv.operator)
        .json(&body)
        .answer()
        .await;
    let st = r.status;
    (st, r.json())
}

async fn state(srv: &TestServer, id: &str, to: &str, reason: Option<&str>) {
    let (st, body) = post(
        srv,
        &format!("/api/v1/machines/{id}/state"),
        json!({"state": to, "reason": reason}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{to}: {body}");
}

fn secrets_file(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("secrets.yaml");
    std::fs::write(
        &p,
        plinth::talos::secrets::SecretsBundle::generate()
            .expect("bundle")
            .to_yaml()
            .expect("yaml"),
    )
    .expect("write");
    p
}

async fn reinstall_without_bmc_reaches_installed(b: Backend) {
    // The port of the node's Talos API (the test service, started with the config it fetches).
    let talos = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = talos.local_addr().expect("addr").port();
    let extra = extra(port, 900);
    let srv = TestServer::start_with(b, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let secrets = secrets_file(tmp.path());
    write_inventory(tmp.path(), &secrets, None);
    apply_dir(&srv, &extra, &tmp.path().join("inv")).await;
    let id = get(&srv, "/api/v1/machines/node-1").await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let cache = plinth::images::ImageCache::new(srv.data_dir.join("images"));
    let schematic = get(&srv, &format!("/api/v1/machines/{id}/config")).await["schematic_id"]
        .as_str()
        .expect("schematic")
        .to_string();
    let k = tmp.path().join("k");
    std::fs::write(&k, b"kernel").expect("k");
    for name in ["kernel-amd64", "initramfs-amd64.xz"] {
        cache
            .import(&schematic, "v1.12.11", name, &k)
            .expect("import");
    }
    let w = workflows(&srv, &extra).await;

    // Follow the rollout on the live stream from the start.
    let mut stream = srv
        .req(
            Method::GET,
            &format!("/api/v1/events/stream?machine={id}&kind=reinstall."),
            &srv.viewer,
        )
        .send()
        .await
        .expect("the stream opens");
    assert_eq!(stream.status(), StatusCode::OK);

    // A registered machine cannot be reinstalled yet (409 naming its state).
    let (st, body) = post(&srv, &format!("/api/v1/machines/{id}/reinstall"), json!({})).await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("registered"), "{body}");
    state(&srv, &id, "ready", None).await;

    let (st, started) = post(
        &srv,
        &format!("/api/v1/machines/{id}/reinstall"),
        json!({"wipe": true}),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{started}");
    assert!(started["next"]
        .as_str()
        .unwrap_or("")
        .contains("power-cycle it now"));
    assert_eq!(started["reinstall"]["stage"], "power");
    let (st, body) = post(&srv, &format!("/api/v1/machines/{id}/reinstall"), json!({})).await;
    assert_eq!(st, StatusCode::CONFLICT, "one at a time: {body}");

    w.tick().await.expect("tick");
    let r = get(&srv, &format!("/api/v1/machines/{id}/reinstall")).await;
    assert_eq!(r["stage"], "netboot", "{r}");
    // Nothing happens until the machine boots.
    w.tick().await.expect("tick");
    assert_eq!(
        get(&srv, &format!("/api/v1/machines/{id}/reinstall")).await["stage"],
        "netboot"
    );

    let script = boot_script(&srv).await;
    assert!(
        script.contains("talos.experimental.wipe=system"),
        "{script}"
    );
    // Talos wipes and reboots before it loads its config: the second boot of the window gets
    // a fresh token but no wipe (else every boot would wipe again, a reboot loop).
    let script = boot_script(&srv).await;
    assert!(script.contains("token="), "{script}");
    assert!(!script.contains("talos.experimental.wipe"), "{script}");
    w.tick().await.expect("tick");
    assert_eq!(
        get(&srv, &format!("/api/v1/machines/{id}/reinstall")).await["stage"],
        "config"
    );
    let (st, config) = fetch(&srv, &id, &token_of(&script), UUID).await;
    assert_eq!(st, StatusCode::OK);
    w.tick().await.expect("tick");
    let r = get(&srv, &format!("/api/v1/machines/{id}/reinstall")).await;
    assert_eq!(r["stage"], "talos_api", "{r}");
    assert_eq!(r["node_address"], "127.0.0.1");
    // Nothing answers yet: the stage waits.
    w.tick().await.expect("tick");
    assert_eq!(
        get(&srv, &format!("/api/v1/machines/{id}/reinstall")).await["stage"],
        "talos_api"
    );
    // The node comes up with the config it was served (a worker: its certificate from trustd).
    let talos = crate::support::talos_node::TalosNode::serve(
        talos,
        &config,
        crate::support::talos_node::NodeOptions {
            trustd_key: Some(crate::support::talos_node::trustd_key_of_bundle(&secrets)),
            ..Default::default()
        },
        crate::support::talos_node::SharedCluster::default(),
    )
    .await;
    w.tick().await.expect("tick");
    let r = get(&srv, &format!("/api/v1/machines/{id}/reinstall")).await;
    assert_eq!(r["stage"], "done", "{r}");
    let m = get(&srv, &format!("/api/v1/machines/{id}")).await;
    assert_eq!(m["state"], "installed");
    // The window closed: the next network boot boots the local disk, the token is dead.
    let again = boot_script(&srv).await;
    assert!(
        again.contains("exit") && !again.contains("token="),
        "{again}"
    );
    assert_eq!(
        fetch(&srv, &id, &token_of(&script), UUID).await.0,
        StatusCode::NOT_FOUND
    );

    // The boot timeline shows the steps in order.
    let tl = get(&srv, &format!("/api/v1/machines/{id}/timeline")).await;
    let kinds: Vec<&str> = tl
        .as_array()
        .expect("timeline")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    let pos = |k: &str| {
        kinds
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("{k} in {kinds:?}"))
    };
    assert!(pos("reinstall.started") < pos("boot.script"));
    assert!(pos("boot.script") < pos("config.served"));
    assert!(pos("config.served") < pos("reinstall.done"));

    // The stream saw every stage in order.
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !seen.contains("event: reinstall.done") && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), stream.chunk()).await {
            Ok(Ok(Some(c))) => seen.push_str(&String::from_utf8_lossy(&c)),
            _ => break,
        }
    }
    let order = [
        "event: reinstall.started",
        "event: reinstall.netboot",
        "event: reinstall.power_cycle_needed",
        "event: reinstall.config",
        "event: reinstall.talos_api",
        "event: reinstall.done",
    ];
    let mut at = 0;
    for o in order {
        let i = seen[at..]
            .find(o)
            .unwrap_or_else(|| panic!("{o} after byte {at} in:\n{seen}"));
        at += i;
    }
    drop(stream);
    drop(talos);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_deadline_fails_then_automatic_retries_stop_at_the_maximum() {
    let extra = extra(1, 1);
    let srv = TestServer::start_with(Backend::Sqlite, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    write_inventory(tmp.path(), &secrets_file(tmp.path()), None);
    let inv = tmp.path().join("inv/all.yaml");
    let text = std::fs::read_to_string(&inv).expect("inv");
    std::fs::write(
        &inv,
        text.replace(
            "talosVersion: v1.12.11\n",
            "talosVersion: v1.12.11\nreinstall:\n  auto: true\n  maxAttempts: 2\n  backoffSeconds: 0\n",
        ),
    )
    .expect("write");
    apply_dir(&srv, &extra, &tmp.path().join("inv")).await;
    let id = get(&srv, "/api/v1/machines/node-1").await["id"]
        .as_str()
        .expect("id")
        .to_string();
    state(&srv, &id, "ready", None).await;
    let w = workflows(&srv, &extra).await;
    let (st, _) = post(&srv, &format!("/api/v1/machines/{id}/reinstall"), json!({})).await;
    assert_eq!(st, StatusCode::ACCEPTED);

    // The machine never boots: each attempt misses the netboot deadline.
    let mut starts = Vec::new();
    for _ in 0..12 {
        w.tick().await.expect("tick");
        let r = get(&srv, &format!("/api/v1/machines/{id}/reinstall")).await;
        starts.push((
            r["attempt"].clone(),
            r["automatic"].clone(),
            r["stage"].clone(),
        ));
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let m = get(&srv, &format!("/api/v1/machines/{id}")).await;
    assert_eq!(m["state"], "failed", "{m}");
    assert!(
        m["state_reason"]
            .as_str()
            .unwrap_or("")
            .contains("stage netboot missed its deadline of 1 s"),
        "{m}"
    );
    let r = get(&srv, &format!("/api/v1/machines/{id}/reinstall")).await;
    assert_eq!(r["stage"], "failed");
    assert_eq!(r["automatic"], true);
    assert_eq!(r["attempt"], 2, "stopped at maxAttempts: {starts:?}");
    let started: Vec<Value> = get(
        &srv,
        &format!("/api/v1/events?machine={id}&kind=reinstall.started"),
    )
    .await
    .as_array()
    .cloned()
    .unwrap_or_default();
    assert_eq!(started.len(), 3, "one manual, two automatic: {started:?}");
    assert_eq!(started[1]["actor"], "plinth");
    srv.finish().await;
}

async fn control_planes_one_at_a_time(b: Backend) {
    let extra = extra(1, 900);
    let srv = TestServer::start_with(b, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let secrets = secrets_file(tmp.path());
    let dir = tmp.path().join("inv");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut doc = format!(
        "kind: Cluster\nname: lab\nendpoint: https://10.88.0.10:6443\ntalosVersion: v1.12.11\nsecrets: {}\nreinstall:\n  auto: true\n  backoffSeconds: 0\n  maxWorkersPerRack: 1\n---\nkind: Profile\nname: vm\ninstallDisk:\n  type: ssd\n",
        secrets.display()
    );
    let names = ["cp-1", "cp-2", "cp-3", "w-1", "w-2"];
    for (i, n) in names.iter().enumerate() {
        let role = if n.starts_with("cp") {
            "control-plane"
        } else {
            "worker"
        };
        doc.push_str(&format!(
            "---\nkind: Machine\nhostname: {n}\nrole: {role}\ncluster: lab\nprofile: vm\nrack: r1\ninterfaces:\n  - mac: \"52:54:00:00:00:0{i}\"\n    boot: true\ndisks:\n  - serial: D{i}\n    type: ssd\n"
        ));
    }
    std::fs::write(dir.join("all.yaml"), doc).expect("write");
    apply_dir(&srv, &extra, &dir).await;
    let mut ids = Vec::new();
    for n in names {
        let id = get(&srv, &format!("/api/v1/machines/{n}")).await["id"]
            .as_str()
            .expect("id")
            .to_string();
        // Installed, then a health check marks all of them failed at once.
        state(&srv, &id, "ready", None).await;
        let (st, b) = post(&srv, &format!("/api/v1/machines/{id}/provision"), json!({})).await;
        assert_eq!(st, StatusCode::OK, "{b}");
        state(&srv, &id, "installed", None).await;
        ids.push(id);
    }
    for id in &ids {
        // A monitor's report, for the cluster's policy to act on (a person's `failed` is not).
        let (st, body) = post(
            &srv,
            &format!("/api/v1/machines/{id}/state"),
            json!({"state": "failed", "reason": "health check: node not ready", "auto_reinstall": true}),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{body}");
    }
    let w = workflows(&srv, &extra).await;
    let provisioning = |list: &Value| -> Vec<String> {
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["state"] == "provisioning")
            .filter_map(|m| m["hostname"].as_str().map(str::to_string))
            .collect()
    };
    w.tick().await.expect("tick");
    let busy = provisioning(&get(&srv, "/api/v1/machines?limit=100").await);
    assert_eq!(
        busy.iter().filter(|h| h.starts_with("cp")).count(),
        1,
        "one control plane at a time: {busy:?}"
    );
    assert_eq!(
        busy.iter().filter(|h| h.starts_with('w')).count(),
        1,
        "one worker per rack: {busy:?}"
    );
    // Another tick changes nothing while those run; a manual reinstall of another control
    // plane is refused naming the rule.
    w.tick().await.expect("tick");
    assert_eq!(
        provisioning(&get(&srv, "/api/v1/machines?limit=100").await),
        busy
    );
    let cp_busy = busy
        .iter()
        .find(|h| h.starts_with("cp"))
        .expect("cp")
        .clone();
    let other = ["cp-1", "cp-2", "cp-3"]
        .into_iter()
        .find(|h| *h != cp_busy)
        .expect("other");
    let (st, body) = post(
        &srv,
        &format!("/api/v1/machines/{other}/reinstall"),
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT);
    assert!(body.to_string().contains("one at a time"), "{body}");

    // The first control plane comes back (an operator confirms it): the next one starts.
    state(&srv, &cp_busy, "installed", None).await;
    w.tick().await.expect("tick");
    let r = get(&srv, &format!("/api/v1/machines/{cp_busy}/reinstall")).await;
    assert_eq!(r["stage"], "done", "{r}");
    w.tick().await.expect("tick");
    let now = provisioning(&get(&srv, "/api/v1/machines?limit=100").await);
    let cps: Vec<&String> = now.iter().filter(|h| h.starts_with("cp")).collect();
    assert_eq!(cps.len(), 1, "{now:?}");
    assert_ne!(cps[0], &cp_busy);
    srv.finish().await;
}

both_backends!(
    reinstall_without_bmc_reaches_installed,
    control_planes_one_at_a_time
);

/// A reinstall through a real Redfish BMC (sushy-emulator): the profile asks for virtual media,
/// so the power stage inserts the ISO, sets a one-time boot from the CD and powers the machine on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reinstall_through_redfish_follows_the_profiles_boot_target() {
    use crate::support::bmc_peers as peers;
    let emu = peers::sushy_emulator(peers::EmulatorSetup {
        auth: Some(("admin".into(), "emu-Pa55-wf".into())),
        tls: false,
    });
    // The ISO the emulator downloads on insert.
    let iso = axum::Router::new().route(
        "/talos.iso",
        axum::routing::get(|| async { vec![0u8; 4096] }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let iso_url = format!("http://{}/talos.iso", l.local_addr().expect("addr"));
    let iso_task = tokio::spawn(async move {
        let _ = axum::serve(l, iso).await;
    });

    let extra = extra(1, 900);
    let srv = TestServer::start_with(Backend::Sqlite, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("inv");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("all.yaml"),
        format!(
            "kind: Cluster\nname: lab\nendpoint: https://10.88.0.10:6443\ntalosVersion: v1.12.11\nsecrets: {}\n---\nkind: Profile\nname: vm\ninstallDisk:\n  type: ssd\nbootTarget: cd\nbootMediaUrl: {iso_url}\n",
            secrets_file(tmp.path()).display()
        ),
    )
    .expect("write");
    apply_dir(&srv, &extra, &dir).await;
    let (st, m) = post(
        &srv,
        "/api/v1/machines",
        json!({"hostname": "bm-1", "role": "worker", "cluster": "lab", "profile": "vm",
               "interfaces": [{"mac": "52:54:00:00:01:01", "boot": true}],
               "disks": [{"serial": "D1", "type": "ssd"}],
               "bmc": {"url": emu.peer.url(), "username": "admin", "password": "emu-Pa55-wf",
                       "tls": "insecure-http"}}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{m}");
    let id = m["id"].as_str().expect("id").to_string();
    state(&srv, &id, "ready", None).await;
    let w = workflows(&srv, &extra).await;
    let (st, started) = post(&srv, &format!("/api/v1/machines/{id}/reinstall"), json!({})).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{started}");
    w.tick().await.expect("tick");
    let r = get(&srv, &format!("/api/v1/machines/{id}/reinstall")).await;
    assert_eq!(r["stage"], "netboot", "{r}");

    // What the BMC was told, in order, and what it now says. The BMC calls run off the tick;
    // wait (bounded) for the power-on to be recorded.
    let mut kinds: Vec<(String, Value)> = Vec::new();
    for _ in 0..120 {
        kinds = get(&srv, &format!("/api/v1/events?machine={id}&kind=bmc."))
            .await
            .as_array()
            .expect("events")
            .iter()
            .map(|e| {
                (
                    e["kind"].as_str().unwrap_or("").to_string(),
                    e["detail"].clone(),
                )
            })
            .collect();
        if kinds.iter().any(|(k, _)| k == "bmc.power") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let order: Vec<&str> = kinds.iter().map(|(k, _)| k.as_str()).collect();
    let media = order
        .iter()
        .position(|k| *k == "bmc.media.insert")
        .unwrap_or_else(|| panic!("{kinds:?}"));
    let boot = order
        .iter()
        .position(|k| *k == "bmc.boot_once")
        .unwrap_or_else(|| panic!("{kinds:?}"));
    let power = order
        .iter()
        .position(|k| *k == "bmc.power")
        .unwrap_or_else(|| panic!("{kinds:?}"));
    assert!(media < boot && boot < power, "{order:?}");
    assert_eq!(kinds[boot].1["target"], "cd", "{kinds:?}");
    let media_now = get(&srv, &format!("/api/v1/machines/{id}/media")).await;
    assert_eq!(media_now["media"]["image"], iso_url.as_str(), "{media_now}");
    assert_eq!(media_now["media"]["inserted"], true);
    let power_now = get(&srv, &format!("/api/v1/machines/{id}/power")).await;
    assert_eq!(power_now["power_state"], "on", "{power_now}");
    iso_task.abort();
    srv.finish().await;
}

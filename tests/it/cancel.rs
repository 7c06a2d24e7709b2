//! Stopping a reinstall (issue 16, item 3), on both backends: a cancel at each stage of the
//! workflow (power, netboot, config, talos_api) leaves the machine in `maintenance` with its
//! window closed, its rack and control-plane slots free, the canceller recorded, and the
//! cluster's automatic reinstall keeping off it; a machine a person marks failed is never
//! reinstalled automatically (a monitor that asks for it is); `machine rm` refuses a machine in
//! the middle of a reinstall unless forced; `provision --close` never leaves a machine holding
//! its slot; `reinstall --follow` ends when the reinstall is cancelled.
//!
//! Like `workflows`, the engine ticks only when the test calls `tick`.

use std::path::Path;
use std::process::Command;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::cli::plinth;
use crate::support::{self, Backend, TestServer};
use crate::talos_configs::{apply_dir, boot_script, fetch, schemas, token_of, MAC, UUID};
use plinth::service::Workflows;

fn extra() -> String {
    format!(
        "[talos]\nschema_dir = \"{}\"\n[workflows]\ntick_seconds = 3600\ntalos_api_port = 1\n",
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
        std::sync::Arc::new(plinth::bmc::RedfishConnector::default()),
    );
    let clusters = plinth::app::clusters(
        &configs,
        &store,
        std::sync::Arc::new(plinth::talos_api::TalosApiClient::default()),
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
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

async fn post(srv: &TestServer, path: &str, body: Value) -> (StatusCode, Value) {
    let r = srv
        .req(Method::POST, path, &srv.operator)
        .json(&body)
        .send()
        .await
        .expect("post");
    let st = r.status();
    (st, r.json().await.unwrap_or(Value::Null))
}

async fn state(srv: &TestServer, id: &str, to: &str) {
    let (st, body) = post(
        srv,
        &format!("/api/v1/machines/{id}/state"),
        json!({"state": to}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{to}: {body}");
}

async fn stage(srv: &TestServer, id: &str) -> String {
    get(srv, &format!("/api/v1/machines/{id}/reinstall")).await["stage"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// A cluster whose policy reinstalls failed machines at once; node-1 (the worker the boot
/// helpers speak for) and w-2 share rack r1 (one worker per rack); cp-1 and cp-2 are control
/// planes.
fn inventory(dir: &Path) -> std::path::PathBuf {
    let secrets = dir.join("secrets.yaml");
    std::fs::write(
        &secrets,
        plinth::talos::secrets::SecretsBundle::generate()
            .expect("bundle")
            .to_yaml()
            .expect("yaml"),
    )
    .expect("write");
    let mut doc = format!(
        "kind: Cluster\nname: lab\nendpoint: https://10.88.0.10:6443\ntalosVersion: v1.12.11\nsecrets: {}\nreinstall:\n  auto: true\n  backoffSeconds: 0\n  maxWorkersPerRack: 1\n---\nkind: Profile\nname: vm\ninstallDisk:\n  type: ssd\n---\nkind: Machine\nhostname: node-1\nsmbios_uuid: {UUID}\nrole: worker\ncluster: lab\nprofile: vm\nrack: r1\ninterfaces:\n  - mac: \"{MAC}\"\n    boot: true\ndisks:\n  - serial: QM00001\n    type: ssd\n",
        secrets.display()
    );
    for (i, (n, role)) in [
        ("w-2", "worker"),
        ("cp-1", "control-plane"),
        ("cp-2", "control-plane"),
    ]
    .iter()
    .enumerate()
    {
        doc.push_str(&format!(
            "---\nkind: Machine\nhostname: {n}\nrole: {role}\ncluster: lab\nprofile: vm\nrack: r1\ninterfaces:\n  - mac: \"52:54:00:00:01:0{i}\"\n    boot: true\ndisks:\n  - serial: D{i}\n    type: ssd\n"
        ));
    }
    let inv = dir.join("inv");
    std::fs::create_dir_all(&inv).expect("mkdir");
    std::fs::write(inv.join("all.yaml"), doc).expect("write");
    inv
}

/// A server with the inventory applied, the cluster's image cached, and the ids by host name.
async fn lab(b: Backend, extra: &str, tmp: &Path) -> (TestServer, Vec<(String, String)>) {
    let srv = TestServer::start_with(b, extra).await;
    apply_dir(&srv, extra, &inventory(tmp)).await;
    let mut ids = Vec::new();
    for n in ["node-1", "w-2", "cp-1", "cp-2"] {
        let id = get(&srv, &format!("/api/v1/machines/{n}")).await["id"]
            .as_str()
            .expect("id")
            .to_string();
        state(&srv, &id, "ready").await;
        ids.push((n.to_string(), id));
    }
    let schematic = get(&srv, &format!("/api/v1/machines/{}/config", ids[0].1)).await
        ["schematic_id"]
        .as_str()
        .expect("schematic")
        .to_string();
    let cache = plinth::images::ImageCache::new(srv.data_dir.join("images"));
    let k = tmp.join("k");
    std::fs::write(&k, b"kernel").expect("k");
    for name in ["kernel-amd64", "initramfs-amd64.xz"] {
        cache
            .import(&schematic, "v1.12.11", name, &k)
            .expect("import");
    }
    (srv, ids)
}

async fn cancel_at_every_stage(b: Backend) {
    let extra = extra();
    let tmp = tempfile::tempdir().expect("tmp");
    let (srv, ids) = lab(b, &extra, tmp.path()).await;
    let (node, w2) = (ids[0].1.clone(), ids[1].1.clone());
    let w = workflows(&srv, &extra).await;
    let operator = "token:test-operator";

    for target in ["power", "netboot", "config", "talos_api"] {
        let (st, started) = post(
            &srv,
            &format!("/api/v1/machines/{node}/reinstall"),
            json!({}),
        )
        .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{target}: {started}");
        // Drive the workflow to the stage under test.
        if target != "power" {
            w.tick().await.expect("tick");
        }
        let mut script = String::new();
        if target == "config" || target == "talos_api" {
            script = boot_script(&srv).await;
            w.tick().await.expect("tick");
        }
        if target == "talos_api" {
            let (st, _) = fetch(&srv, &node, &token_of(&script), UUID).await;
            assert_eq!(st, StatusCode::OK);
            w.tick().await.expect("tick");
        }
        assert_eq!(stage(&srv, &node).await, target);
        // The rack's one worker slot is taken.
        let (st, body) = post(&srv, &format!("/api/v1/machines/{w2}/reinstall"), json!({})).await;
        assert_eq!(st, StatusCode::CONFLICT, "{target}: {body}");

        let (st, c) = post(&srv, "/api/v1/machines/node-1/reinstall/cancel", json!({})).await;
        assert_eq!(st, StatusCode::OK, "{target}: {c}");
        assert_eq!(
            (c["state"].as_str(), c["stage"].as_str()),
            (Some("maintenance"), Some(target))
        );
        let r = get(&srv, &format!("/api/v1/machines/{node}/reinstall")).await;
        assert_eq!(r["stage"], "cancelled", "{target}: {r}");
        assert_eq!(r["cancelled_by"], operator, "{r}");
        let m = get(&srv, &format!("/api/v1/machines/{node}")).await;
        assert_eq!(m["state"], "maintenance", "{m}");
        assert_eq!(
            (m["state_by"].as_str(), m["manual_hold"].as_bool()),
            (Some(operator), Some(true))
        );
        // The event names who cancelled, and at which stage.
        let evs = crate::talos_configs::events(&srv, &node, "reinstall.cancelled").await;
        let last = evs.last().expect("reinstall.cancelled event");
        assert_eq!(last["actor"], operator, "{last}");
        assert_eq!(last["detail"]["stage"], target, "{last}");
        // The window is closed: no install, and the token of the boot (if any) is dead.
        let cfg = get(&srv, &format!("/api/v1/machines/{node}/config")).await;
        assert_eq!(cfg["window_open"], false, "{cfg}");
        let again = boot_script(&srv).await;
        assert!(!again.contains("token="), "{again}");
        if !script.is_empty() {
            assert_eq!(
                fetch(&srv, &node, &token_of(&script), UUID).await.0,
                StatusCode::NOT_FOUND
            );
        }
        // Ticks change nothing: no stage moves, no automatic reinstall.
        w.tick().await.expect("tick");
        w.tick().await.expect("tick");
        assert_eq!(stage(&srv, &node).await, "cancelled");
        assert_eq!(
            get(&srv, &format!("/api/v1/machines/{node}")).await["state"],
            "maintenance"
        );
        // The rack slot is free: w-2 may start (then is cancelled too, for the next round).
        let (st, body) = post(&srv, &format!("/api/v1/machines/{w2}/reinstall"), json!({})).await;
        assert_eq!(st, StatusCode::ACCEPTED, "{target}: {body}");
        let (st, body) = post(
            &srv,
            &format!("/api/v1/machines/{w2}/reinstall/cancel"),
            json!({}),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{body}");
        // Nothing left to cancel: 409 naming why.
        let (st, body) = post(
            &srv,
            &format!("/api/v1/machines/{node}/reinstall/cancel"),
            json!({}),
        )
        .await;
        assert_eq!(st, StatusCode::CONFLICT, "{body}");
        assert!(body.to_string().contains("nothing to cancel"), "{body}");
        state(&srv, &node, "ready").await;
        state(&srv, &w2, "ready").await;
    }

    // The control-plane slot: cp-2 waits while cp-1 reinstalls, and may go once cp-1's is
    // cancelled through the CLI.
    let (cp1, cp2) = (ids[2].1.clone(), ids[3].1.clone());
    let (st, body) = post(
        &srv,
        &format!("/api/v1/machines/{cp1}/reinstall"),
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    w.tick().await.expect("tick");
    let (st, body) = post(
        &srv,
        &format!("/api/v1/machines/{cp2}/reinstall"),
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("one at a time"), "{body}");
    let env = [
        ("PLINTH_SERVER", srv.base.clone()),
        ("PLINTH_TOKEN", srv.operator.clone()),
    ];
    let (code, out, err) = plinth(
        tmp.path(),
        &["machine", "reinstall", "cp-1", "--cancel"],
        &env,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("cancelled at stage netboot") && out.contains("maintenance"),
        "{out}"
    );
    let (st, body) = post(
        &srv,
        &format!("/api/v1/machines/{cp2}/reinstall"),
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    srv.finish().await;
}

/// A person's `failed` is theirs: the cluster's automatic reinstall leaves the machine alone. A
/// monitor that asks for the policy (`auto_reinstall`) gets it.
async fn failed_by_a_person_is_never_reinstalled_automatically(b: Backend) {
    let extra = extra();
    let tmp = tempfile::tempdir().expect("tmp");
    let (srv, ids) = lab(b, &extra, tmp.path()).await;
    let (node, w2) = (ids[0].1.clone(), ids[1].1.clone());
    let w = workflows(&srv, &extra).await;
    // Both installed (provisioned, then confirmed by hand).
    for id in [&node, &w2] {
        let (st, b) = post(&srv, &format!("/api/v1/machines/{id}/provision"), json!({})).await;
        assert_eq!(st, StatusCode::OK, "{b}");
        state(&srv, id, "installed").await;
    }
    let (st, body) = post(
        &srv,
        &format!("/api/v1/machines/{node}/state"),
        json!({"state": "failed", "reason": "cancel"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["manual_hold"], true, "{body}");
    w.tick().await.expect("tick");
    w.tick().await.expect("tick");
    let m = get(&srv, &format!("/api/v1/machines/{node}")).await;
    assert_eq!(m["state"], "failed", "{m}");
    let r = srv
        .req(
            Method::GET,
            &format!("/api/v1/machines/{node}/reinstall"),
            &srv.viewer,
        )
        .send()
        .await
        .expect("get");
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "no reinstall was started"
    );

    let (st, body) = post(
        &srv,
        &format!("/api/v1/machines/{w2}/state"),
        json!({"state": "failed", "reason": "health check: node not ready", "auto_reinstall": true}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    w.tick().await.expect("tick");
    let r = get(&srv, &format!("/api/v1/machines/{w2}/reinstall")).await;
    assert_eq!(
        (r["automatic"].as_bool(), r["stage"].as_str()),
        (Some(true), Some("power")),
        "{r}"
    );
    srv.finish().await;
}

/// `machine rm` refuses a machine in the middle of a reinstall, and `--force` cancels and removes
/// it; `provision --close` on a provisioning machine leaves it in maintenance, not provisioning.
async fn rm_and_close_mid_reinstall(b: Backend) {
    let extra = extra();
    let tmp = tempfile::tempdir().expect("tmp");
    let (srv, ids) = lab(b, &extra, tmp.path()).await;
    let (node, w2) = (ids[0].1.clone(), ids[1].1.clone());
    let w = workflows(&srv, &extra).await;
    let env = [
        ("PLINTH_SERVER", srv.base.clone()),
        ("PLINTH_TOKEN", srv.operator.clone()),
    ];
    let (st, body) = post(
        &srv,
        &format!("/api/v1/machines/{node}/reinstall"),
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    w.tick().await.expect("tick");

    // The API: 409 naming the way out.
    let version = get(&srv, &format!("/api/v1/machines/{node}")).await["version"]
        .as_i64()
        .expect("version");
    let r = srv
        .req(
            Method::DELETE,
            &format!("/api/v1/machines/{node}"),
            &srv.operator,
        )
        .header("If-Match", format!("\"{version}\""))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let body = r.text().await.unwrap_or_default();
    assert!(
        body.contains("--cancel") && body.contains("--force"),
        "{body}"
    );
    // The CLI: refused, then forced.
    let (code, out, err) = plinth(tmp.path(), &["machine", "rm", "node-1"], &env);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("reinstall of node-1 is running"), "{err}");
    assert_eq!(
        get(&srv, &format!("/api/v1/machines/{node}")).await["state"],
        "provisioning"
    );
    let (code, out, err) = plinth(tmp.path(), &["machine", "rm", "node-1", "--force"], &env);
    assert_eq!(code, 0, "{out}{err}");
    let r = srv
        .req(
            Method::GET,
            &format!("/api/v1/machines/{node}"),
            &srv.viewer,
        )
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let evs = get(&srv, "/api/v1/events?kind=reinstall.cancelled").await;
    let evs: Vec<&Value> = evs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["machine_id"] == node.as_str())
        .collect();
    assert_eq!(evs.len(), 1, "the forced removal cancelled first: {evs:?}");

    // provision, then provision --close: maintenance, slot free.
    let (code, out, err) = plinth(tmp.path(), &["machine", "provision", "w-2"], &env);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        get(&srv, &format!("/api/v1/machines/{w2}")).await["state"],
        "provisioning"
    );
    let (code, out, err) = plinth(
        tmp.path(),
        &["machine", "provision", "w-2", "--close"],
        &env,
    );
    assert_eq!(code, 0, "{out}{err}");
    let m = get(&srv, &format!("/api/v1/machines/{w2}")).await;
    assert_eq!(m["state"], "maintenance", "{m}");
    let cfg = get(&srv, &format!("/api/v1/machines/{w2}/config")).await;
    assert_eq!(cfg["window_open"], false, "{cfg}");
    srv.finish().await;
}

/// `machine reinstall --follow` ends, failing, when someone cancels the reinstall, and says by
/// whom.
async fn follow_ends_when_cancelled(b: Backend) {
    let extra = extra();
    let tmp = tempfile::tempdir().expect("tmp");
    let (srv, ids) = lab(b, &extra, tmp.path()).await;
    let node = ids[0].1.clone();
    let bin = env!("CARGO_BIN_EXE_plinth");
    let mut child = Command::new(bin)
        .args(["machine", "reinstall", "node-1", "--follow"])
        .env("PLINTH_SERVER", &srv.base)
        .env("PLINTH_TOKEN", &srv.operator)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // Wait (bounded) for the reinstall to start, then cancel it.
    let mut started = false;
    for _ in 0..100 {
        let r = srv
            .req(
                Method::GET,
                &format!("/api/v1/machines/{node}/reinstall"),
                &srv.viewer,
            )
            .send()
            .await
            .expect("get");
        if r.status() == StatusCode::OK {
            started = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(started, "the CLI started the reinstall");
    let (st, body) = post(
        &srv,
        &format!("/api/v1/machines/{node}/reinstall/cancel"),
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let mut status = None;
    for _ in 0..100 {
        if let Some(s) = child.try_wait().expect("wait") {
            status = Some(s);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        status.is_some(),
        "--follow ended with the cancel: {stdout}{stderr}"
    );
    assert!(!out.status.success());
    assert!(stdout.contains("reinstall.cancelled"), "{stdout}");
    assert!(
        stderr.contains("cancelled by token:test-operator at stage power"),
        "{stderr}"
    );
    srv.finish().await;
}

both_backends!(
    cancel_at_every_stage,
    failed_by_a_person_is_never_reinstalled_automatically,
    rm_and_close_mid_reinstall,
    follow_ends_when_cancelled
);

//! Why a machine waits (issue 16, item 4): a boot that holds because the cluster's Talos image is
//! not cached names the exact `plinth image pull` command in its `boot.script` event, on the
//! timeline, in `machine reinstall`'s warning and in `--follow`'s `waiting:` line; an unknown
//! machine's event says it waits to be accepted; `machine status` (and its API) shows the stage
//! with its deadline, the last boot step, why it waits and the power state; `provision` checks the image first and starts
//! the pull, which fetches kernel and initramfs together, once, with bounded progress events
//! (the Image Factory is the loopback server of `images_pull`).

use std::process::Command;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::images_pull::factory;
use crate::support::{self, Backend, TestServer};
use crate::talos_configs::{apply_dir, boot_script, events, schemas, write_inventory};

async fn get(srv: &TestServer, path: &str) -> Value {
    srv.get_json(path, &srv.viewer).await
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

/// `plinth ARGS` against `srv` with the viewer's token (and `env`): exit code, stdout, stderr.
fn viewer_cli(
    srv: &TestServer,
    dir: &std::path::Path,
    args: &[&str],
    env: &[(&str, String)],
) -> (i32, String, String) {
    let mut all = vec![
        ("PLINTH_SERVER", srv.base.clone()),
        ("PLINTH_TOKEN", srv.viewer.clone()),
    ];
    all.extend_from_slice(env);
    crate::cli::plinth(dir, args, &all)
}

/// node-1 of `write_inventory`, ready; its id and its cluster's schematic.
async fn node(srv: &TestServer, extra: &str, dir: &std::path::Path) -> (String, String) {
    let secrets = dir.join("s.yaml");
    std::fs::write(
        &secrets,
        plinth::talos::secrets::SecretsBundle::generate()
            .expect("b")
            .to_yaml()
            .expect("y"),
    )
    .expect("w");
    write_inventory(dir, &secrets, None);
    apply_dir(srv, extra, &dir.join("inv")).await;
    let m = get(srv, "/api/v1/machines/node-1").await;
    let id = m["id"].as_str().expect("id").to_string();
    let (st, body) = post(
        srv,
        &format!("/api/v1/machines/{id}/state"),
        json!({"state": "ready"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let schematic = get(srv, &format!("/api/v1/machines/{id}/config")).await["schematic_id"]
        .as_str()
        .expect("schematic")
        .to_string();
    (id, schematic)
}

async fn uncached_image_hold_names_the_pull_command(b: Backend) {
    let extra = format!(
        "[talos]\nschema_dir = \"{}\"\n[workflows]\ntick_seconds = 3600\n",
        schemas().display()
    );
    let srv = TestServer::start_with(b, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let (id, schematic) = node(&srv, &extra, tmp.path()).await;
    let command =
        format!("plinth image pull --version v1.12.11 --arch amd64 --schematic {schematic}");

    let mut child = Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args(["machine", "reinstall", "node-1", "--follow"])
        .env("PLINTH_SERVER", &srv.base)
        .env("PLINTH_TOKEN", &srv.operator)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut started = false;
    for _ in 0..100 {
        let r = srv
            .req(
                Method::GET,
                &format!("/api/v1/machines/{id}/reinstall"),
                &srv.viewer,
            )
            .send()
            .await
            .expect("get");
        if r.status() == StatusCode::OK {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(started, "the CLI started the reinstall");

    // The machine boots twice: it holds, and says why, with the command that fixes it.
    for _ in 0..2 {
        let script = boot_script(&srv).await;
        assert!(!script.contains("token="), "{script}");
    }
    let holds = events(&srv, &id, "boot.script").await;
    let last = holds.last().expect("boot.script");
    assert_eq!(last["detail"]["plan"], "hold", "{last}");
    let reason = last["detail"]["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("image not cached") && reason.contains(&command),
        "{reason}"
    );
    let tl = get(&srv, &format!("/api/v1/machines/{id}/timeline")).await;
    assert!(
        tl.as_array()
            .into_iter()
            .flatten()
            .any(|e| e["detail"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains(&command))),
        "{tl}"
    );
    let (code, out, err) = viewer_cli(&srv, tmp.path(), &["machine", "timeline", "node-1"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&command), "{out}");

    // machine status says where it stands and why it waits (API and CLI).
    let st = get(&srv, "/api/v1/machines/node-1/status").await;
    assert_eq!(st["state"], "provisioning", "{st}");
    assert_eq!(st["reinstall"]["stage"], "power", "{st}");
    assert!(st["reinstall"]["stage_deadline"].is_string(), "{st}");
    assert_eq!(st["last_boot_step"]["kind"], "boot.script", "{st}");
    assert!(
        st["waiting"].as_str().is_some_and(|w| w.contains(&command)),
        "{st}"
    );
    assert!(
        st["power"].is_null() && st["power_error"].is_null(),
        "no BMC: {st}"
    );
    // Wide enough that the table keeps the command on one line.
    let (code, out, err) = viewer_cli(
        &srv,
        tmp.path(),
        &["machine", "status", "node-1"],
        &[("COLUMNS", "1000".into())],
    );
    assert_eq!(code, 0, "{err}");
    for want in [
        "waiting",
        &command,
        "stage power",
        "deadline",
        "power",
        "unknown (no BMC)",
    ] {
        assert!(out.contains(want), "status shows {want}: {out}");
    }

    // Cancel: --follow ends; it printed the hold once (two polls, one reason) with the command.
    let (st, body) = post(
        &srv,
        &format!("/api/v1/machines/{id}/reinstall/cancel"),
        json!({}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let mut ended = false;
    for _ in 0..100 {
        if child.try_wait().expect("wait").is_some() {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !ended {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(ended, "{stdout}{stderr}");
    let waiting: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" waiting: "))
        .collect();
    assert_eq!(waiting.len(), 1, "{stdout}");
    assert!(waiting[0].contains(&command), "{stdout}");
    // The reinstall warned up front, with the same command.
    assert!(
        stderr.contains("warning: ") && stderr.contains(&command),
        "{stderr}"
    );

    // An unknown machine's boot says what it waits for.
    let r = srv
        .client
        .get(srv.url("/boot/machine.ipxe?mac=52-54-00-99-99-01&buildarch=x86_64&platform=efi"))
        .send()
        .await
        .expect("script");
    assert_eq!(r.status(), StatusCode::OK);
    let found = get(&srv, "/api/v1/machines/lookup?mac=52-54-00-99-99-01").await;
    let unknown = found["id"].as_str().expect("discovered").to_string();
    let ev = events(&srv, &unknown, "boot.").await;
    let reason = ev.last().expect("boot event")["detail"]["reason"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        reason.contains("waiting for an operator to accept it")
            && reason.contains("plinth machine state 52:54:00:99:99:01 registered"),
        "{reason}"
    );
    srv.finish().await;
}

/// `provision` checks the image first and starts the pull: kernel and initramfs, each fetched
/// once however often the machine polls, with progress events at most every tenth of a file;
/// the machine installs once both are there.
async fn provision_pulls_both_files_once_with_progress(b: Backend) {
    let (url, f, h) = factory().await;
    let extra = format!(
        "[talos]\nschema_dir = \"{}\"\n[images]\nfactory_url = \"{url}\"\n",
        schemas().display()
    );
    let srv = TestServer::start_with(b, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let (id, _) = node(&srv, &extra, tmp.path()).await;

    let (st, w) = post(&srv, &format!("/api/v1/machines/{id}/provision"), json!({})).await;
    assert_eq!(st, StatusCode::OK, "{w}");
    assert!(
        w["warnings"].as_array().into_iter().flatten().any(|x| x
            .as_str()
            .is_some_and(|x| x.contains("pulling kernel and initramfs"))),
        "{w}"
    );
    // The machine polls while the pull runs: it holds, saying so.
    let script = boot_script(&srv).await;
    assert!(!script.contains("token="), "{script}");
    let hold = events(&srv, &id, "boot.script").await;
    let reason = hold.last().expect("hold")["detail"]["reason"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(reason.contains("being downloaded from"), "{reason}");
    let _ = boot_script(&srv).await;

    let mut done = false;
    for _ in 0..300 {
        if !events(&srv, &id, "image.pull_done").await.is_empty() {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(done, "{:?}", events(&srv, &id, "image.").await);
    let hits = f.hits.lock().expect("hits").clone();
    assert_eq!(hits.get("v1.12.11/kernel-amd64"), Some(&1), "{hits:?}");
    assert_eq!(
        hits.get("v1.12.11/initramfs-amd64.xz"),
        Some(&1),
        "{hits:?}"
    );
    assert_eq!(events(&srv, &id, "image.pull_started").await.len(), 1);
    let progress = events(&srv, &id, "image.pull_progress").await;
    for file in ["kernel-amd64", "initramfs-amd64.xz"] {
        let steps: Vec<&Value> = progress
            .iter()
            .filter(|e| e["detail"]["file"] == file)
            .collect();
        assert!(
            (1..=10).contains(&steps.len()),
            "{file}: {} progress events",
            steps.len()
        );
        assert_eq!(
            steps.last().expect("step")["detail"]["percent"],
            100,
            "{file}"
        );
    }
    // Both files are there: the next boot installs.
    let script = boot_script(&srv).await;
    assert!(script.contains("token="), "{script}");
    h.abort();
    srv.finish().await;
}

both_backends!(
    uncached_image_hold_names_the_pull_command,
    provision_pulls_both_files_once_with_progress
);

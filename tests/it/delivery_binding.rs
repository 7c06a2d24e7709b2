//! Config delivery bound to the machine (issue 15, item 1): a control-plane machine's config is
//! never served without a recorded SMBIOS UUID; with `delivery: approve` a config is released only
//! after an operator approves the code the machine's boot script shows.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{self, Backend, TestServer};
use crate::talos_configs::{
    apply_dir, boot_script, events, fetch, schemas, token_of, write_inventory, UUID,
};

/// A server with `node-1` declared with `role`, without an SMBIOS UUID, in its provisioning
/// window with its Talos image cached; its id.
pub(crate) async fn provisioning_without_uuid(
    b: Backend,
    role: &str,
    cluster_extra: &str,
) -> (TestServer, String, tempfile::TempDir) {
    let extra = format!("[talos]\nschema_dir = \"{}\"\n", schemas().display());
    let srv = TestServer::start_with(b, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let secrets = tmp.path().join("lab-secrets.yaml");
    std::fs::write(
        &secrets,
        plinth::talos::secrets::SecretsBundle::generate()
            .expect("bundle")
            .to_yaml()
            .expect("yaml"),
    )
    .expect("write");
    write_inventory(tmp.path(), &secrets, None);
    let inv = tmp.path().join("inv/all.yaml");
    let text = std::fs::read_to_string(&inv)
        .expect("inv")
        .replace(&format!("smbios_uuid: {UUID}\n"), "")
        .replace("role: worker", &format!("role: {role}"))
        .replace(
            "talosVersion: v1.12.11\n",
            &format!("talosVersion: v1.12.11\n{cluster_extra}"),
        );
    std::fs::write(&inv, text).expect("write");
    apply_dir(&srv, &extra, &tmp.path().join("inv")).await;
    let m = machine(&srv, "node-1").await;
    assert!(m["smbios_uuid"].is_null(), "{m}");
    let id = m["id"].as_str().expect("id").to_string();
    let r = srv
        .req(
            Method::POST,
            &format!("/api/v1/machines/{id}/state"),
            &srv.operator,
        )
        .json(&json!({ "state": "ready" }))
        .send()
        .await
        .expect("state");
    assert_eq!(r.status(), StatusCode::OK);
    let r = srv
        .req(
            Method::POST,
            &format!("/api/v1/machines/{id}/provision"),
            &srv.operator,
        )
        .json(&json!({}))
        .send()
        .await
        .expect("open");
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "{}",
        r.text().await.unwrap_or_default()
    );
    let st: Value = srv
        .req(
            Method::GET,
            &format!("/api/v1/machines/{id}/config"),
            &srv.viewer,
        )
        .send()
        .await
        .expect("status")
        .json()
        .await
        .expect("json");
    let schematic = st["schematic_id"].as_str().expect("schematic").to_string();
    let cache = plinth::images::ImageCache::new(srv.data_dir.join("images"));
    let k = tmp.path().join("k");
    std::fs::write(&k, b"kernel").expect("k");
    for name in ["kernel-amd64", "initramfs-amd64.xz"] {
        cache
            .import(&schematic, "v1.12.11", name, &k)
            .expect("import");
    }
    (srv, id, tmp)
}

pub(crate) async fn machine(srv: &TestServer, name: &str) -> Value {
    srv.req(
        Method::GET,
        &format!("/api/v1/machines/{name}"),
        &srv.viewer,
    )
    .send()
    .await
    .expect("machine")
    .json()
    .await
    .expect("json")
}

/// A control-plane machine without a recorded SMBIOS UUID gets no config, whatever UUID its fetch
/// presents (a worker would bind it): the refusal says why; recorded by an operator, the UUID
/// lets the next boot's fetch through.
async fn a_control_plane_needs_a_recorded_uuid(b: Backend) {
    let (srv, id, _tmp) = provisioning_without_uuid(b, "control-plane", "").await;
    let token = token_of(&boot_script(&srv).await);
    assert_eq!(
        fetch(&srv, &id, &token, UUID).await.0,
        StatusCode::NOT_FOUND
    );
    let m = machine(&srv, "node-1").await;
    assert!(m["smbios_uuid"].is_null(), "no UUID bound: {m}");
    assert!(events(&srv, &id, "config.uuid_bound").await.is_empty());
    let refused = events(&srv, &id, "config.refused").await;
    assert!(
        refused.iter().any(|e| e["detail"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("control-plane") && r.contains("smbios_uuid"))),
        "{refused:?}"
    );
    let r = srv
        .req(
            Method::PATCH,
            &format!("/api/v1/machines/{id}"),
            &srv.operator,
        )
        .header("If-Match", format!("\"{}\"", m["version"]))
        .json(&json!({ "smbios_uuid": UUID }))
        .send()
        .await
        .expect("edit");
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "{}",
        r.text().await.unwrap_or_default()
    );
    let token = token_of(&boot_script(&srv).await);
    let (st, yaml) = fetch(&srv, &id, &token, UUID).await;
    assert_eq!(st, StatusCode::OK, "{yaml}");
    assert!(yaml.contains("type: controlplane"), "{yaml}");
    srv.finish().await;
}

/// The code an install script shows.
fn code_of(script: &str) -> String {
    let at = script
        .find("approval code ")
        .unwrap_or_else(|| panic!("no approval code in the script:\n{script}"))
        + "approval code ".len();
    script[at..]
        .split_whitespace()
        .next()
        .expect("code")
        .to_string()
}

/// `plinth` against `srv` with the operator's token.
fn cli(srv: &TestServer, args: &[&str]) -> (bool, String) {
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

/// `delivery: approve`: the install script shows a code; every fetch is refused (one answer, the
/// reason "awaiting approval" in the events and the config status) until an operator approves
/// that code; a wrong code is refused and is an anomaly; a new boot needs a new approval.
async fn delivery_approve_releases_only_after_the_operator_approves(b: Backend) {
    let (srv, id, _tmp) = provisioning_without_uuid(b, "worker", "delivery: approve\n").await;
    let script = boot_script(&srv).await;
    let code = code_of(&script);
    assert_eq!(code.len(), 9, "{code}");
    let token = token_of(&script);
    assert_eq!(
        fetch(&srv, &id, &token, UUID).await.0,
        StatusCode::NOT_FOUND
    );
    let refused = events(&srv, &id, "config.refused").await;
    assert!(
        refused.iter().any(|e| e["detail"]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("awaiting approval"))),
        "{refused:?}"
    );
    let st: Value = srv
        .req(
            Method::GET,
            &format!("/api/v1/machines/{id}/config"),
            &srv.viewer,
        )
        .send()
        .await
        .expect("status")
        .json()
        .await
        .expect("json");
    assert!(
        st["hold"]
            .as_str()
            .is_some_and(|h| h.starts_with("awaiting approval")),
        "{st}"
    );
    // A wrong code: refused naming `code`, an anomaly; the config stays held.
    let (ok, out) = cli(&srv, &["machine", "approve", "node-1", "AAAA-AAAA"]);
    assert!(!ok && out.contains("code"), "{out}");
    assert_eq!(
        events(&srv, &id, "config.approval_code_mismatch")
            .await
            .len(),
        1
    );
    // A viewer cannot approve.
    let r = srv
        .req(
            Method::POST,
            &format!("/api/v1/machines/{id}/config/approve"),
            &srv.viewer,
        )
        .json(&json!({ "code": code }))
        .send()
        .await
        .expect("approve");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // The operator types what the console shows (case and dash do not matter).
    let typed = code.to_lowercase().replace('-', "");
    let (ok, out) = cli(&srv, &["machine", "approve", "node-1", &typed]);
    assert!(ok, "{out}");
    assert_eq!(events(&srv, &id, "config.approved").await.len(), 1);
    let (st, yaml) = fetch(&srv, &id, &token, UUID).await;
    assert_eq!(st, StatusCode::OK, "{yaml}");
    // The next install boot shows a new code and waits for its own approval.
    let script = boot_script(&srv).await;
    let second = code_of(&script);
    let token = token_of(&script);
    assert_eq!(
        fetch(&srv, &id, &token, UUID).await.0,
        StatusCode::NOT_FOUND
    );
    let r = srv
        .req(
            Method::POST,
            &format!("/api/v1/machines/{id}/config/approve"),
            &srv.operator,
        )
        .json(&json!({ "code": second }))
        .send()
        .await
        .expect("approve");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(fetch(&srv, &id, &token, UUID).await.0, StatusCode::OK);
    srv.finish().await;
}

both_backends!(
    a_control_plane_needs_a_recorded_uuid,
    delivery_approve_releases_only_after_the_operator_approves
);

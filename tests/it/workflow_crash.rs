//! kill -9 in the middle of every reinstall stage: the real server process is killed while the
//! reinstall waits in `netboot`, in `config` and in `talos_api`, restarted on the same database,
//! and the reinstall carries on from where the database says, to `installed`, with no stage
//! repeated or skipped.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::{json, Value};

use crate::cli::{plinth, serve, Server};
use crate::talos_configs::{schemas, token_of, write_inventory, MAC, UUID};

struct Rig {
    logs: std::sync::Mutex<String>,
    dir: tempfile::TempDir,
    cfg: String,
    token: String,
    http: Client,
}

impl Rig {
    fn start(&self) -> Server {
        // Debug logging: the test checks that no token or config secret reaches the log.
        serve(
            self.dir.path(),
            &["--config", &self.cfg],
            &[("RUST_LOG", "debug".to_string())],
        )
    }

    fn api(&self, srv: &Server, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut r = self
            .http
            .request(method, format!("{}/api/v1{path}", srv.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().expect("api");
        let status = resp.status();
        let v: Value = resp.json().unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {v}");
        v
    }

    fn wait_stage(&self, srv: &Server, id: &str, stage: &str) {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.api(
                srv,
                reqwest::Method::GET,
                &format!("/machines/{id}/reinstall"),
                None,
            );
            if r["stage"] == stage {
                return;
            }
            assert!(r["stage"] != "failed", "reinstall failed: {r}");
            assert!(Instant::now() < until, "stage {stage} not reached: {r}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// kill -9 and start again on the same database; the stage must not have moved back.
    fn crash(&self, srv: Server, id: &str, stage: &str) -> Server {
        let pid = srv.child.id();
        self.logs
            .lock()
            .expect("logs")
            .push_str(&srv.log.lock().expect("log"));
        drop(srv); // SIGKILL by PID, then reaped
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the server process is gone"
        );
        let srv = self.start();
        let r = self.api(
            &srv,
            reqwest::Method::GET,
            &format!("/machines/{id}/reinstall"),
            None,
        );
        assert_eq!(
            r["stage"], stage,
            "after the restart the reinstall is where it was: {r}"
        );
        srv
    }
}

#[test]
fn kill_9_at_every_reinstall_stage_resumes_to_installed() {
    let talos = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = talos.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = dir.path().join("plinth.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = \"{}\"\n[talos]\nschema_dir = \"{}\"\n[workflows]\ntick_seconds = 1\ntalos_api_port = {port}\n",
            dir.path().join("data").display(),
            schemas().display()
        ),
    )
    .expect("config");
    let cfg_s = cfg.display().to_string();
    let secrets = dir.path().join("secrets.yaml");
    let (code, _, err) = plinth(
        dir.path(),
        &[
            "cluster",
            "init",
            "lab",
            "--endpoint",
            "https://10.88.0.10:6443",
            "--out",
            secrets.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    write_inventory(dir.path(), &secrets, None);
    let inv = dir.path().join("inv");
    let (code, _, err) = plinth(
        dir.path(),
        &["--config", &cfg_s, "apply", inv.to_str().expect("utf-8")],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (code, token, err) = plinth(
        dir.path(),
        &["--config", &cfg_s, "token", "create", "--role", "operator"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let k = dir.path().join("k");
    std::fs::write(&k, b"kernel").expect("k");
    let (code, _, err) = plinth(
        dir.path(),
        &[
            "--config",
            &cfg_s,
            "image",
            "import",
            "--version",
            "v1.12.11",
            "--kernel",
            k.to_str().expect("p"),
            "--initramfs",
            k.to_str().expect("p"),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let rig = Rig {
        logs: std::sync::Mutex::new(String::new()),
        dir,
        cfg: cfg_s,
        token: token.trim().to_string(),
        http: Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .expect("client"),
    };

    let srv = rig.start();
    let id = rig.api(&srv, reqwest::Method::GET, "/machines/node-1", None)["id"]
        .as_str()
        .expect("id")
        .to_string();
    rig.api(
        &srv,
        reqwest::Method::POST,
        &format!("/machines/{id}/state"),
        Some(json!({"state": "ready"})),
    );
    rig.api(
        &srv,
        reqwest::Method::POST,
        &format!("/machines/{id}/reinstall"),
        Some(json!({})),
    );
    rig.wait_stage(&srv, &id, "netboot");
    let srv = rig.crash(srv, &id, "netboot");

    // The machine network-boots (to the restarted server) and gets its install script.
    let script = rig
        .http
        .get(format!(
            "{}/boot/machine.ipxe?mac={}&uuid={UUID}&buildarch=x86_64&platform=efi",
            srv.base,
            MAC.replace(':', "-")
        ))
        .send()
        .expect("script")
        .text()
        .expect("text");
    let token = token_of(&script);
    rig.wait_stage(&srv, &id, "config");
    let srv = rig.crash(srv, &id, "config");

    // The token minted before the crash is still the boot's token.
    let r = rig
        .http
        .get(format!(
            "{}/config/{id}?token={token}&uuid={UUID}",
            srv.base
        ))
        .send()
        .expect("config");
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    let config = r.text().expect("config");
    rig.wait_stage(&srv, &id, "talos_api");
    let srv = rig.crash(srv, &id, "talos_api");

    // The node's Talos API comes up with the config it was served; the restarted server verifies
    // it over mutual TLS.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    talos.set_nonblocking(true).expect("nonblocking");
    let node = rt.block_on(async {
        crate::support::talos_node::TalosNode::serve(
            tokio::net::TcpListener::from_std(talos).expect("listener"),
            &config,
            crate::support::talos_node::NodeOptions {
                trustd_key: Some(crate::support::talos_node::trustd_key_of_bundle(&secrets)),
                ..Default::default()
            },
            crate::support::talos_node::SharedCluster::default(),
        )
        .await
    });

    rig.wait_stage(&srv, &id, "done");
    let m = rig.api(&srv, reqwest::Method::GET, &format!("/machines/{id}"), None);
    assert_eq!(m["state"], "installed");
    let kinds: Vec<String> = rig
        .api(
            &srv,
            reqwest::Method::GET,
            &format!("/events?machine={id}&kind=reinstall."),
            None,
        )
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["kind"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        kinds,
        [
            "reinstall.started",
            "reinstall.netboot",
            "reinstall.power_cycle_needed",
            "reinstall.config",
            "reinstall.talos_api",
            "reinstall.done"
        ],
        "every stage exactly once"
    );
    // Nothing secret in the logs of any of the four server runs: not the boot's token, not the
    // API token, not a secret of the served config.
    let mut logs = rig.logs.lock().expect("logs").clone();
    logs.push_str(&srv.log.lock().expect("log"));
    assert!(logs.contains("config served"), "the log is captured");
    let doc = plinth::talos::MachineConfig::parse(&config).expect("config parses");
    let v = doc.v1alpha1().expect("doc");
    for secret in [
        token.as_str(),
        rig.token.as_str(),
        v["machine"]["token"].as_str().expect("machine token"),
        v["cluster"]["token"].as_str().expect("cluster token"),
        v["cluster"]["secret"].as_str().expect("cluster secret"),
    ] {
        assert!(!logs.contains(secret), "a secret reached the log");
    }
    drop(srv);
    drop(node);
}

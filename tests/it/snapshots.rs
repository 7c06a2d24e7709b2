//! etcd snapshots and recovery against a running Plinth, the Talos API service of the tests on
//! loopback (three control planes sharing one etcd; each streams a generated etcd database with
//! etcd's SHA-256 trailer and records what it streamed and what it was given back), a directory
//! store on disk, and a real S3-compatible server (`s3s-fs`, started here on loopback):
//!
//! - a snapshot is verified (the stand-in's SHA-256 and revision, what is stored is sealed),
//!   listed, kept as the policy says (retention only after a newer one is verified), refused while
//!   another instance holds the turn, and failed (event, metric, nothing removed) when the stream
//!   is corrupted;
//! - over S3: stored, then restored onto a wiped control plane byte for byte (the SHA-256 the node
//!   received equals what a node streamed), the others rejoin; refused while etcd has quorum,
//!   refused once done; a tampered object is never uploaded whole;
//! - a 1 GiB snapshot through a Plinth process of its own, its peak RSS (VmHWM) read from /proc.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::talos_node::{NodeOptions, SharedCluster, TalosNode};
use crate::support::{self, free_port, Ask as _, Backend, TestServer};
use crate::talos_configs::{apply_dir, schemas};
use plinth::domain::Role;
use plinth::talos::generate::{generate, GenerateOptions};
use plinth::talos::secrets::SecretsBundle;
use plinth::talos::TalosVersion;

const CPS: [&str; 3] = ["cp-1", "cp-2", "cp-3"];

/// `s3s-fs` on loopback, stopped (by its PID) on drop.
pub struct S3 {
    child: Child,
    pub endpoint: String,
    pub key: &'static str,
    pub secret: &'static str,
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where `s3s-fs` is: on the PATH or in ~/.cargo/bin (`tests/setup-and-run.sh` installs it).
pub fn s3s_fs() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join("s3s-fs"))
        .chain([Path::new(&home).join(".cargo/bin/s3s-fs")])
        .find(|p| p.is_file())
        .expect("s3s-fs is needed (tests/setup-and-run.sh --install-only installs it with cargo install)")
}

impl S3 {
    /// Start it over `root` with one bucket `bucket`.
    pub async fn start(root: &Path, bucket: &str) -> S3 {
        std::fs::create_dir_all(root.join(bucket)).expect("bucket");
        let port = free_port();
        let child = Command::new(s3s_fs())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--access-key",
                "PLINTHTEST",
                "--secret-key",
                "plinth-test-secret",
            ])
            .arg(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn s3s-fs");
        let s3 = S3 {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            key: "PLINTHTEST",
            secret: "plinth-test-secret",
        };
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return s3;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("s3s-fs did not listen on {port}");
    }

    /// `[snapshots]` lines naming it, the credentials in a 0600 file under `dir`.
    pub fn config(&self, dir: &Path) -> String {
        let creds = dir.join("s3-credentials.toml");
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&creds)
                .expect("credentials file");
            writeln!(
                f,
                "access_key_id = \"{}\"\nsecret_access_key = \"{}\"",
                self.key, self.secret
            )
            .expect("write");
        }
        format!(
            "s3_endpoint = \"{}\"\ns3_region = \"us-east-1\"\ns3_allow_http = true\ns3_credentials_file = \"{}\"\n",
            self.endpoint,
            creds.display()
        )
    }
}

/// A cluster of three control planes on 127.0.`net`.1-3, its secrets, its etcd.
pub struct Lab {
    pub srv: TestServer,
    pub extra: String,
    pub tmp: tempfile::TempDir,
    pub etcd: SharedCluster,
    pub nodes: Vec<TalosNode>,
}

fn ip(net: u8, n: usize) -> IpAddr {
    format!("127.0.{net}.{}", n + 1).parse().expect("ip")
}

/// The server's config for a lab whose nodes answer on `port` (plus `[snapshots]` lines).
fn extra(port: u16, snapshots: &str) -> String {
    format!(
        "[talos]\nschema_dir = \"{}\"\n[workflows]\ntick_seconds = 3600\ntalos_api_port = {port}\nhealth_seconds = 3600\n[snapshots]\ntick_seconds = 3600\n{snapshots}",
        schemas().display()
    )
}

impl Lab {
    /// Start Plinth, declare the cluster with `policy` (`etcdSnapshots`), install its machines
    /// (their state set by hand), start its nodes streaming `snapshot_bytes`, bootstrap etcd.
    pub async fn start(
        b: Backend,
        net: u8,
        policy: &str,
        snapshots_config: impl FnOnce(&Path) -> String,
        snapshot_bytes: u64,
    ) -> Lab {
        let tmp = tempfile::tempdir().expect("tmp");
        let port = free_port();
        let extra = extra(port, &snapshots_config(tmp.path()));
        let srv = TestServer::start_with(b, &extra).await;
        let bundle = SecretsBundle::generate().expect("bundle");
        let secrets = tmp.path().join("secrets.yaml");
        std::fs::write(&secrets, bundle.to_yaml().expect("yaml")).expect("secrets");
        let inv = tmp.path().join("inv");
        std::fs::create_dir_all(&inv).expect("inv");
        let mut doc = format!(
            "kind: Cluster\nname: lab\nendpoint: https://10.88.0.10:6443\ntalosVersion: v1.12.11\nsecrets: {}\netcdSnapshots: {policy}\n---\nkind: Profile\nname: vm\ninstallDisk:\n  type: ssd\n",
            secrets.display()
        );
        for (i, name) in CPS.iter().enumerate() {
            doc.push_str(&format!(
                "---\nkind: Machine\nhostname: {name}\nrole: control-plane\ncluster: lab\nprofile: vm\ninterfaces:\n  - mac: \"52:54:00:20:{net:02x}:{i:02x}\"\n    boot: true\n"
            ));
        }
        std::fs::write(inv.join("all.yaml"), doc).expect("write");
        apply_dir(&srv, &extra, &inv).await;
        for name in CPS {
            for state in ["maintenance", "installed"] {
                let r = srv
                    .req(
                        Method::POST,
                        &format!("/api/v1/machines/{name}/state"),
                        &srv.operator,
                    )
                    .json(&json!({ "state": state }))
                    .answer()
                    .await;
                assert_eq!(r.status, StatusCode::OK, "{name} -> {state}: {}", r.text);
            }
        }
        let etcd = SharedCluster::default();
        let mut nodes = Vec::new();
        for (i, name) in CPS.iter().enumerate() {
            let opts = GenerateOptions::new(
                "lab",
                "https://10.88.0.10:6443",
                TalosVersion::new(1, 12, 11),
            );
            let config = generate(&bundle, Role::ControlPlane, &opts)
                .expect("generate")
                .to_yaml()
                .expect("yaml");
            nodes.push(
                TalosNode::start(
                    SocketAddr::new(ip(net, i), port),
                    &config,
                    NodeOptions {
                        hostname: Some(name.to_string()),
                        snapshot_bytes: Some(snapshot_bytes),
                        ..Default::default()
                    },
                    etcd.clone(),
                )
                .await,
            );
        }
        // Each install verified as the reinstall workflow verifies it (Version over mTLS): the
        // address Plinth then talks to.
        let w = support::workflows(&srv, &extra).await;
        let machines = srv
            .db
            .stores()
            .await
            .machines
            .all_machines(&plinth::service::MachineFilter {
                cluster: Some("lab".into()),
                limit: 100,
                ..Default::default()
            })
            .await
            .expect("machines");
        for m in &machines {
            let i = CPS
                .iter()
                .position(|n| m.hostname.as_deref() == Some(*n))
                .expect("a lab machine");
            let v = w
                .clusters()
                .verify_install(m, &ip(net, i).to_string())
                .await
                .expect("verify");
            assert!(
                matches!(v, plinth::service::clusters::Verification::Verified(_)),
                "{v:?}"
            );
        }
        let lab = Lab {
            srv,
            extra,
            tmp,
            etcd,
            nodes,
        };
        let (st, body) = lab
            .post(
                &lab.srv.admin,
                "/api/v1/clusters/lab/bootstrap",
                json!({"node": "cp-1"}),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{body}");
        // The others join etcd as Talos' etcd service does (on their next call: the first
        // measurement), so the second sees three members.
        lab.get("/api/v1/clusters/lab/health").await;
        let h = lab.get("/api/v1/clusters/lab/health").await;
        assert_eq!(h["etcd"]["healthy_members"], 3, "{h}");
        lab
    }

    pub async fn get(&self, path: &str) -> Value {
        self.srv
            .req(Method::GET, path, &self.srv.admin)
            .answer()
            .await
            .json()
    }

    pub async fn post(&self, token: &str, path: &str, body: Value) -> (StatusCode, String) {
        let r = self
            .srv
            .req(Method::POST, path, token)
            .json(&body)
            .answer()
            .await;
        (r.status, r.text)
    }

    /// Take a snapshot through the API: (status, body).
    pub async fn snapshot(&self) -> (StatusCode, Value) {
        let r = self
            .srv
            .req(
                Method::POST,
                "/api/v1/clusters/lab/snapshots",
                &self.srv.operator,
            )
            .answer()
            .await;
        let v = serde_json::from_str(&r.text).unwrap_or(Value::String(r.text.clone()));
        (r.status, v)
    }

    pub async fn events(&self, kind: &str) -> Vec<Value> {
        self.get(&format!("/api/v1/events?kind={kind}&limit=500"))
            .await
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// GET `path` until its `state` is no longer `taking` (bounded: two minutes).
    pub async fn follow(&self, path: &str) -> Value {
        for _ in 0..1200 {
            let v = self.get(path).await;
            if v["state"] != "taking" {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{path} still taking after two minutes");
    }

    /// Wait until `f` holds (bounded: two minutes).
    pub async fn wait_for(&self, what: &str, mut f: impl FnMut() -> bool) {
        for _ in 0..1200 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("waited two minutes for {what}");
    }

    /// A config file for a Plinth process of its own serving the lab's database, key and
    /// settings.
    pub fn process_config(&self) -> PathBuf {
        let config = self.tmp.path().join("plinth.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"{}\"\n{}\n[log]\nlevel = \"info\"\n[secrets]\nkey_file = \"{}\"\n",
                self.srv.db.dir.path().display(),
                self.extra,
                self.srv.db.dir.path().join("test.key").display()
            ),
        )
        .expect("config");
        config
    }

    /// What the stand-ins streamed, every node: (bytes, SHA-256).
    pub fn streamed(&self) -> Vec<(u64, String)> {
        self.nodes.iter().flat_map(|n| n.snapshots()).collect()
    }

    pub async fn finish(self) {
        drop(self.nodes);
        self.srv.finish().await;
    }
}

/// Run the CLI with `args`; once a line of its stderr holds `line` (it got a 202 and follows
/// the record), call `then`. Its success, stdout and stderr (bounded: ten minutes).
async fn cli_following(
    args: Vec<String>,
    line: &'static str,
    then: impl FnOnce() + Send + 'static,
) -> (bool, String, String) {
    tokio::task::spawn_blocking(move || {
        use std::io::{BufRead as _, Read as _};
        let mut child = Command::new(env!("CARGO_BIN_EXE_plinth"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cli");
        let stderr = child.stderr.take().expect("stderr");
        let mut stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for l in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(l);
            }
        });
        let mut err = String::new();
        let mut then = Some(then);
        while let Ok(l) = rx.recv_timeout(Duration::from_secs(600)) {
            if l.contains(line) {
                if let Some(f) = then.take() {
                    f();
                }
            }
            err.push_str(&l);
            err.push('\n');
        }
        if let Some(f) = then.take() {
            // Never said it follows: let the node go anyway, so nothing stays held.
            f();
            err.push_str(&format!("(never printed `{line}`)\n"));
        }
        let mut out = String::new();
        stdout.read_to_string(&mut out).expect("stdout");
        let _ = reader.join();
        let ok = child.wait().expect("cli").success();
        (ok && !err.contains("(never printed"), out, err)
    })
    .await
    .expect("join")
}

fn dir_policy(dir: &Path, keep: u32) -> String {
    format!(
        "{{every: 6h, keep: {keep}, store: \"file://{}\"}}",
        dir.display()
    )
}

async fn snapshots_to_a_directory_are_sealed_verified_kept_and_failures_recorded(b: Backend) {
    let store = tempfile::tempdir().expect("store");
    let net = if b == Backend::Sqlite { 21 } else { 22 };
    let lab = Lab::start(
        b,
        net,
        &dir_policy(store.path(), 2),
        |_| String::new(),
        3 << 20,
    )
    .await;

    let (st, first) = lab.snapshot().await;
    assert_eq!(st, StatusCode::CREATED, "{first}");
    assert_eq!(first["state"], "verified", "{first}");
    assert_eq!(
        first["revision"], 1_000_000,
        "the revision in etcd's database"
    );
    let streamed = lab.streamed();
    assert_eq!(streamed.len(), 1, "one node streamed it once");
    assert_eq!(first["size_bytes"], streamed[0].0, "{first}");
    assert_eq!(
        first["sha256"],
        streamed[0].1.as_str(),
        "what the node streamed"
    );
    assert_eq!(first["talos_version"], "v1.12.11");
    assert_eq!(first["nodes"], json!(CPS));
    assert!(CPS.contains(&first["taken_from"].as_str().expect("from")));
    assert_eq!(first["requested_by"], "token:test-operator");
    // Stored sealed: our header, no etcd page in clear, and a sidecar saying what it is.
    let object = store.path().join(first["object"].as_str().expect("object"));
    let sealed = std::fs::read(&object).expect("the object is on disk");
    assert_eq!(first["stored_bytes"], sealed.len() as u64);
    assert_eq!(&sealed[..8], b"PLNSNAP1");
    let magic = 0xED0C_DAEDu32.to_le_bytes();
    assert!(
        !sealed.windows(4).any(|w| w == magic),
        "bbolt's meta magic would show in a clear snapshot"
    );
    let sidecar: Value = serde_json::from_slice(
        &std::fs::read(format!("{}.json", object.display())).expect("sidecar"),
    )
    .expect("json");
    assert_eq!(sidecar["revision"], 1_000_000);
    assert_eq!(sidecar["sha256"], first["sha256"]);
    assert!(sidecar["encryption"]
        .as_str()
        .expect("enc")
        .contains("XChaCha20-Poly1305"));

    // Two more (the revision moved on): keep 2, so the first goes once the third is verified.
    lab.etcd.lock().expect("etcd").revision = 1_000_700;
    let (st, second) = lab.snapshot().await;
    assert_eq!(st, StatusCode::CREATED, "{second}");
    assert_eq!(second["revision"], 1_000_700);
    assert!(object.exists(), "two verified snapshots are kept");
    let (st, third) = lab.snapshot().await;
    assert_eq!(st, StatusCode::CREATED, "{third}");
    assert!(
        !object.exists(),
        "the oldest went once a newer one was verified"
    );
    let list = lab.get("/api/v1/clusters/lab/snapshots").await;
    let states: Vec<&str> = list
        .as_array()
        .expect("list")
        .iter()
        .map(|r| r["state"].as_str().expect("state"))
        .collect();
    assert_eq!(states, ["verified", "verified", "deleted"], "{list}");
    assert_eq!(list[0]["id"], third["id"], "newest first");
    assert_eq!(lab.events("cluster.snapshot_deleted").await.len(), 1);

    // The use case the rolling upgrade's pre-check calls.
    let snaps = support::snapshots_with(&lab.srv, &lab.extra).await;
    let latest = snaps
        .latest_verified("lab")
        .await
        .expect("store")
        .expect("one");
    assert_eq!(latest.id.to_string(), third["id"].as_str().expect("id"));

    // A corrupted stream: failed (etcd's trailer does not match), an event, a metric; the
    // verified ones stay.
    lab.etcd.lock().expect("etcd").snapshot_corrupt = true;
    let (st, failed) = lab.snapshot().await;
    assert_eq!(st, StatusCode::BAD_GATEWAY, "{failed}");
    assert!(failed.to_string().contains("trailer"), "{failed}");
    let list = lab.get("/api/v1/clusters/lab/snapshots").await;
    assert_eq!(list[0]["state"], "failed", "{list}");
    assert_eq!(list[1]["state"], "verified");
    assert_eq!(list[2]["state"], "verified");
    assert!(store
        .path()
        .join(list[1]["object"].as_str().expect("o"))
        .exists());
    assert!(
        !store
            .path()
            .join(list[0]["object"].as_str().expect("o"))
            .exists(),
        "nothing of a failed snapshot is left in the store"
    );
    let ev = lab.events("cluster.snapshot_failed").await;
    assert_eq!(ev.len(), 1, "{ev:?}");
    let metrics = lab
        .srv
        .req(Method::GET, "/metrics", &lab.srv.admin)
        .answer()
        .await
        .text;
    assert!(
        metrics.contains("plinth_etcd_snapshot_failures_total{cluster=\"lab\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("plinth_etcd_snapshot_age_seconds{cluster=\"lab\"}"),
        "{metrics}"
    );
    lab.etcd.lock().expect("etcd").snapshot_corrupt = false;

    // One at a time: another instance holds the turn.
    let stores = lab.srv.db.stores().await;
    let now = chrono::Utc::now();
    assert!(stores
        .snapshots
        .take_snapshot_turn(
            "lab",
            "other-instance",
            now,
            now + chrono::Duration::hours(1)
        )
        .await
        .expect("turn"));
    let (st, busy) = lab.snapshot().await;
    assert_eq!(st, StatusCode::CONFLICT, "{busy}");
    assert!(busy.to_string().contains("snapshot_in_progress"), "{busy}");
    stores
        .snapshots
        .release_snapshot_turn("lab", "other-instance")
        .await
        .expect("release");

    // Viewers may list, not take; the CLI lists as JSON.
    let (st, _) = lab
        .post(&lab.srv.viewer, "/api/v1/clusters/lab/snapshots", json!({}))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let out = Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args([
            "cluster",
            "snapshots",
            "lab",
            "--json",
            "--server",
            &lab.srv.base,
        ])
        .args(["--token", &lab.srv.viewer])
        .output()
        .expect("cli");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(4), "{listed}");

    // Longer than the caller waits: 202 with the snapshot `taking`, then followed to its end.
    let r = lab
        .srv
        .req(
            Method::POST,
            "/api/v1/clusters/lab/snapshots?wait_seconds=241",
            &lab.srv.operator,
        )
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("wait_seconds"), "{}", r.text);
    lab.etcd.lock().expect("etcd").hold = true;
    let r = lab
        .srv
        .req(
            Method::POST,
            "/api/v1/clusters/lab/snapshots?wait_seconds=0",
            &lab.srv.operator,
        )
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let accepted = r.json();
    assert_eq!(accepted["state"], "taking", "{accepted}");
    let id = accepted["id"].as_str().expect("id").to_string();
    let one = format!("/api/v1/clusters/lab/snapshots/{id}");
    assert_eq!(lab.get(&one).await["state"], "taking");
    lab.etcd.lock().expect("etcd").hold = false;
    let done = lab.follow(&one).await;
    assert_eq!(done["state"], "verified", "{done}");
    // The CLI follows a 202 to the end: the node holds the stream until the CLI says it
    // follows.
    lab.etcd.lock().expect("etcd").hold = true;
    let mut args: Vec<String> = [
        "cluster",
        "snapshot",
        "lab",
        "--wait-seconds",
        "0",
        "--json",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--server".into(), lab.srv.base.clone()]);
    args.extend(["--token".into(), lab.srv.operator.clone()]);
    let etcd = lab.etcd.clone();
    let (ok, out, err) = cli_following(args, "is being taken; following it", move || {
        etcd.lock().expect("etcd").hold = false;
    })
    .await;
    assert!(ok, "{err}");
    let followed: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(followed["state"], "verified", "{followed}");
    lab.finish().await;
}

async fn recovery_from_s3_round_trips_byte_for_byte_once_and_never_with_quorum(b: Backend) {
    let root = tempfile::tempdir().expect("s3 root");
    let s3 = S3::start(root.path(), "snaps").await;
    let net = if b == Backend::Sqlite { 23 } else { 24 };
    let lab = Lab::start(
        b,
        net,
        "{every: 6h, keep: 5, store: \"s3://snaps/etcd/prod\"}",
        |dir| s3.config(dir),
        2 << 20,
    )
    .await;
    let (st, snap) = lab.snapshot().await;
    assert_eq!(st, StatusCode::CREATED, "{snap}");
    let id = snap["id"].as_str().expect("id").to_string();
    let sha = snap["sha256"].as_str().expect("sha").to_string();
    let object = root
        .path()
        .join("snaps/etcd/prod")
        .join(snap["object"].as_str().expect("o"));
    assert!(
        object.is_file(),
        "stored in the bucket under the prefix: {}",
        object.display()
    );
    assert_eq!(
        std::fs::metadata(&object).expect("meta").len(),
        snap["stored_bytes"].as_u64().expect("n")
    );

    // etcd has quorum: refused, forced or not, unless the cluster's name is typed.
    let (st, body) = lab
        .post(
            &lab.srv.admin,
            "/api/v1/clusters/lab/recover",
            json!({"snapshot": id}),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    assert!(
        body.contains("quorum_held") && body.contains("3 of 3"),
        "{body}"
    );
    let (st, body) = lab
        .post(
            &lab.srv.admin,
            "/api/v1/clusters/lab/recover",
            json!({"snapshot": id, "force": true, "confirm": "prod"}),
        )
        .await;
    assert_eq!(
        st,
        StatusCode::CONFLICT,
        "a wrong name is no confirmation: {body}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args(["cluster", "recover", "lab", "--snapshot", id.as_str()])
        .args(["--server", &lab.srv.base, "--token", &lab.srv.admin])
        .stdin(Stdio::null())
        .output()
        .expect("cli");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("quorum"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (st, _) = lab
        .post(
            &lab.srv.operator,
            "/api/v1/clusters/lab/recover",
            json!({"snapshot": id}),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "admins only");
    assert!(lab.nodes.iter().all(|n| n.recover_uploads().is_empty()));

    // The control plane lost its majority and was wiped: etcd waits for a bootstrap everywhere.
    for n in &lab.nodes {
        n.lose_etcd();
    }
    // A tampered object is never uploaded whole: the upload is abandoned, nothing is claimed.
    let (st, other) = lab.snapshot().await;
    assert_eq!(
        st,
        StatusCode::CONFLICT,
        "no healthy control plane to take one from: {other}"
    );
    assert!(
        other
            .to_string()
            .contains("no control plane with healthy etcd"),
        "{other}"
    );
    let pristine = std::fs::read(&object).expect("object");
    let mut bad = pristine.clone();
    let at = bad.len() / 2;
    bad[at] ^= 1;
    std::fs::write(&object, &bad).expect("tamper");
    let (st, body) = lab
        .post(
            &lab.srv.admin,
            "/api/v1/clusters/lab/recover",
            json!({"snapshot": id}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains("cannot decrypt"), "{body}");
    // The upload was abandoned when a chunk did not decrypt: the node never holds the snapshot's
    // bytes whole (what it may have kept fails etcd's own trailer check), and Plinth never asked
    // it to bootstrap from it.
    for n in &lab.nodes {
        assert!(
            n.recover_uploads()
                .iter()
                .all(|(size, _, trailer_ok)| !trailer_ok
                    && *size < snap["size_bytes"].as_u64().expect("size")),
            "never the whole snapshot: {:?}",
            n.recover_uploads()
        );
        assert!(n.recovered_from().is_empty());
    }
    let r = lab
        .srv
        .req(Method::GET, "/api/v1/clusters/lab/recovery", &lab.srv.admin)
        .answer()
        .await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "the claim was given back: {}",
        r.text
    );
    std::fs::write(&object, &pristine).expect("restore the object");

    // Recovered on the first wiped control plane from the decrypted snapshot, byte for byte;
    // the node takes its time (longer than the caller waits): 202, and the CLI follows it.
    lab.etcd.lock().expect("etcd").hold = true;
    let mut args: Vec<String> = ["cluster", "recover", "lab", "--snapshot", id.as_str()]
        .map(String::from)
        .to_vec();
    args.extend(["--wait-seconds", "0", "--json"].map(String::from));
    args.extend(["--server".into(), lab.srv.base.clone()]);
    args.extend(["--token".into(), lab.srv.admin.clone()]);
    let etcd = lab.etcd.clone();
    let (ok, out, err) = cli_following(args, "is under way; following it", move || {
        etcd.lock().expect("etcd").hold = false;
    })
    .await;
    assert!(ok, "{err}");
    let r = lab
        .srv
        .req(Method::GET, "/api/v1/clusters/lab/recovery", &lab.srv.admin)
        .answer()
        .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "the claim is recorded: {}",
        r.text
    );
    let rec: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(rec["state"], "done", "{rec}");
    assert_eq!(rec["node"], "cp-1");
    assert_eq!(rec["forced"], false);
    assert!(
        rec["detail"]
            .as_str()
            .expect("detail")
            .contains("every control plane rejoined"),
        "{rec}"
    );
    let uploads = lab.nodes[0].recover_uploads();
    assert_eq!(uploads.len(), 1);
    assert_eq!(uploads[0].0, snap["size_bytes"].as_u64().expect("size"));
    assert_eq!(
        uploads[0].1, sha,
        "what the node received is what a node streamed"
    );
    assert!(uploads[0].2, "etcd's own trailer checks out");
    assert_eq!(lab.nodes[0].recovered_from(), vec![sha.clone()]);
    let h = lab.get("/api/v1/clusters/lab/health").await;
    assert_eq!(h["etcd"]["healthy_members"], 3, "{h}");
    assert_eq!(lab.etcd.lock().expect("etcd").revision(), 1_000_000);
    assert_eq!(lab.events("cluster.recovered").await.len(), 1);

    // Once per cluster.
    let (st, body) = lab
        .post(
            &lab.srv.admin,
            "/api/v1/clusters/lab/recover",
            json!({"snapshot": id, "force": true, "confirm": "lab"}),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("already_recovered"), "{body}");
    let r = lab.get("/api/v1/clusters/lab/recovery").await;
    assert_eq!(r["snapshot_id"], id.as_str());
    lab.finish().await;
    drop(s3);
}

crate::both_backends!(
    snapshots_to_a_directory_are_sealed_verified_kept_and_failures_recorded,
    recovery_from_s3_round_trips_byte_for_byte_once_and_never_with_quorum,
);

/// A snapshot that streams for longer than its turn keeps it: the turn is renewed in a task of
/// its own while the node holds the stream (here for more than two turns), so another instance
/// never gets it, and the snapshot ends verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_longer_than_its_turn_keeps_the_turn() {
    let store = tempfile::tempdir().expect("store");
    let lab = Lab::start(
        Backend::Sqlite,
        27,
        &dir_policy(store.path(), 3),
        |_| "turn_seconds = 3\n".to_string(),
        1 << 20,
    )
    .await;
    lab.etcd.lock().expect("etcd").hold = true;
    let r = lab
        .srv
        .req(
            Method::POST,
            "/api/v1/clusters/lab/snapshots?wait_seconds=0",
            &lab.srv.operator,
        )
        .answer()
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let id = r.json()["id"].as_str().expect("id").to_string();
    lab.wait_for("the node to stream", || {
        lab.etcd.lock().expect("etcd").snapshots_begun > 0
    })
    .await;
    // Two turns and more go by while the node holds the stream.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let other = support::snapshots_as(&lab.srv.db, &lab.extra, "other-instance").await;
    let busy = other.take("lab", "token:other").await;
    assert!(
        matches!(
            busy,
            Err(plinth::service::snapshots::SnapshotError::Busy(_))
        ),
        "the turn is still held: {busy:?}"
    );
    lab.etcd.lock().expect("etcd").hold = false;
    let done = lab
        .follow(&format!("/api/v1/clusters/lab/snapshots/{id}"))
        .await;
    assert_eq!(done["state"], "verified", "{done}");
    assert_eq!(lab.streamed().len(), 1);
    // Given back when done: the other instance takes the next one.
    let next = other.take("lab", "token:other").await.expect("next");
    assert_eq!(next.instance, "other-instance");
    lab.finish().await;
}

/// Two Plinth instances on one PostgreSQL asked for a snapshot of the same cluster at once:
/// exactly one takes it (the node streams once), the other is refused as busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_postgresql_take_one_snapshot() {
    let store = tempfile::tempdir().expect("store");
    let lab = Lab::start(
        Backend::Postgres,
        28,
        &dir_policy(store.path(), 3),
        |_| String::new(),
        1 << 20,
    )
    .await;
    let a = support::snapshots_as(&lab.srv.db, &lab.extra, "instance-a").await;
    let b = support::snapshots_as(&lab.srv.db, &lab.extra, "instance-b").await;
    // The node holds its stream: whichever gets the turn cannot finish before the other has
    // answered.
    lab.etcd.lock().expect("etcd").hold = true;
    let ta = tokio::spawn(async move { a.take("lab", "token:a").await });
    let tb = tokio::spawn(async move { b.take("lab", "token:b").await });
    lab.wait_for("one of them to answer", || {
        ta.is_finished() || tb.is_finished()
    })
    .await;
    let (loser, winner) = if ta.is_finished() { (ta, tb) } else { (tb, ta) };
    let lost = loser.await.expect("join");
    assert!(
        matches!(
            lost,
            Err(plinth::service::snapshots::SnapshotError::Busy(_))
        ),
        "{lost:?}"
    );
    assert!(
        !winner.is_finished(),
        "the other streams (held by the node)"
    );
    lab.etcd.lock().expect("etcd").hold = false;
    let won = winner.await.expect("join").expect("the snapshot");
    assert_eq!(won.state.as_str(), "verified");
    assert_eq!(lab.streamed().len(), 1, "the node streamed once");
    let list = lab.get("/api/v1/clusters/lab/snapshots").await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(
        lab.events("cluster.snapshot_started").await.len(),
        1,
        "one attempt recorded"
    );
    lab.finish().await;
}

/// Files of `dir` (recursively) whose names hold `#`: `object_store`'s staged part uploads.
fn staged(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(staged(&p));
        } else if e.file_name().to_string_lossy().contains('#') {
            out.push(p);
        }
    }
    out
}

/// A Plinth killed with `kill -9` while it takes a snapshot into a directory: the row stays
/// `taking` and a partial upload is on disk; the next start (another process, so once the dead
/// one's turn expired) marks it failed, removes what it left, and takes the next snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_cut_by_kill_9_is_cleaned_up_by_the_next_start() {
    let store = tempfile::tempdir().expect("store");
    let lab = Lab::start(
        Backend::Sqlite,
        29,
        &dir_policy(store.path(), 3),
        |_| "turn_seconds = 3\n".to_string(),
        24 << 20,
    )
    .await;
    {
        // Held once 16 MiB went out: the store has begun its multipart upload (8 MiB parts).
        let mut c = lab.etcd.lock().expect("etcd");
        c.hold = true;
        c.hold_after = 16 << 20;
    }
    let config = lab.process_config();
    let args = [
        "--config",
        config.to_str().expect("path"),
        "--database-url",
        lab.srv.db.url.as_str(),
    ];
    let server = crate::cli::serve(lab.tmp.path(), &args, &[]);
    let r = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/clusters/lab/snapshots?wait_seconds=0",
            server.base
        ))
        .bearer_auth(&lab.srv.operator)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.json::<Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    lab.wait_for("16 MiB streamed", || {
        lab.etcd.lock().expect("etcd").snapshots_begun > 0
    })
    .await;
    lab.wait_for("a part upload on disk", || !staged(store.path()).is_empty())
        .await;
    let pid = server.child.id();
    drop(server); // SIGKILL by PID, then reaped
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    let one = format!("/api/v1/clusters/lab/snapshots/{id}");
    assert_eq!(lab.get(&one).await["state"], "taking");
    assert!(
        !staged(store.path()).is_empty(),
        "the partial upload is left"
    );
    lab.etcd.lock().expect("etcd").hold = false;

    // The next start cleans up: failed, its leftovers removed, the turn free again.
    let server = crate::cli::serve(lab.tmp.path(), &args, &[]);
    let failed = lab.follow(&one).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert!(
        failed["error"]
            .as_str()
            .unwrap_or("")
            .contains("interrupted"),
        "{failed}"
    );
    lab.wait_for("the partial upload removed", || {
        staged(store.path()).is_empty()
    })
    .await;
    assert!(!store
        .path()
        .join(failed["object"].as_str().expect("object"))
        .exists());
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/clusters/lab/snapshots", server.base))
        .bearer_auth(&lab.srv.operator)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::CREATED);
    let next: Value = r.json().await.expect("json");
    assert_eq!(next["state"], "verified", "{next}");
    assert!(store
        .path()
        .join(next["object"].as_str().expect("object"))
        .is_file());
    assert_eq!(lab.events("cluster.snapshot_failed").await.len(), 1);
    drop(server);
    lab.finish().await;
}

/// Peak resident memory of a process (VmHWM), bytes.
pub fn vm_hwm(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// A large snapshot (256 MiB; `PLINTH_BIG_SNAPSHOT_MIB` for more, e.g. 1024), taken by a Plinth
/// process of its own (serving the lab's database) into S3: verified, and that process never
/// held more than a sliver of it (its peak RSS, VmHWM, read from /proc).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_snapshot_streams_through_plinth_in_bounded_memory() {
    let mib: u64 = std::env::var("PLINTH_BIG_SNAPSHOT_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let big: u64 = mib << 20;
    let root = tempfile::tempdir().expect("s3 root");
    let s3 = S3::start(root.path(), "snaps").await;
    let lab = Lab::start(
        Backend::Sqlite,
        25,
        "{every: 6h, keep: 1, store: \"s3://snaps/big\"}",
        |dir| s3.config(dir),
        big,
    )
    .await;
    // The same database, key and settings, served by a process whose memory is measured.
    let config = lab.process_config();
    let server = crate::cli::serve(
        lab.tmp.path(),
        &[
            "--config",
            config.to_str().expect("path"),
            "--database-url",
            &lab.srv.db.url,
        ],
        &[],
    );
    let pid = server.child.id();
    let before = vm_hwm(pid);
    let started = std::time::Instant::now();
    let r = reqwest::Client::builder()
        .timeout(Duration::from_secs(1800))
        .build()
        .expect("client")
        .post(format!("{}/api/v1/clusters/lab/snapshots", server.base))
        .bearer_auth(&lab.srv.operator)
        .send()
        .await
        .expect("answer");
    let status = r.status();
    let mut body: Value = r.json().await.expect("json");
    if status == StatusCode::ACCEPTED {
        // Longer than the request waits: followed to its end (bounded: 30 minutes).
        let one = format!(
            "{}/api/v1/clusters/lab/snapshots/{}",
            server.base,
            body["id"].as_str().expect("id")
        );
        for _ in 0..1800 {
            if body["state"] != "taking" {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            body = reqwest::Client::new()
                .get(&one)
                .bearer_auth(&lab.srv.operator)
                .send()
                .await
                .expect("answer")
                .json()
                .await
                .expect("json");
        }
    } else {
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let took = started.elapsed();
    assert_eq!(body["state"], "verified", "{body}");
    assert_eq!(body["size_bytes"].as_u64(), Some(big + 32));
    assert_eq!(body["sha256"], lab.streamed()[0].1.as_str());
    let peak = vm_hwm(pid);
    eprintln!(
        "{mib} MiB snapshot: {:.1} s ({:.1} MB/s streamed, stored, read back); plinth VmHWM {} MiB before, {} MiB after",
        took.as_secs_f64(),
        (big + 32) as f64 / 1e6 / took.as_secs_f64(),
        before >> 20,
        peak >> 20
    );
    assert!(
        peak < before + (big / 2).min(192 << 20),
        "Plinth's peak RSS went from {} to {} MiB for a {mib} MiB snapshot: it must stream, not hold it",
        before >> 20,
        peak >> 20
    );
    drop(server);
    lab.finish().await;
    drop(s3);
}

/// The benchmark of `bench/etcd_snapshot.sh` (ignored in the suite: it measures, it asserts
/// nothing about speed): a snapshot of `PLINTH_BENCH_SNAPSHOT_MIB` MiB (default 512) taken by a
/// Plinth process into `s3s-fs` (streamed from the node, checked, sealed, uploaded, then read
/// back and verified), against `curl` uploading the same bytes in clear to the same server (and
/// downloading them again, the read-back Plinth's verification does). Prints MB/s and ratios.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: bench/etcd_snapshot.sh runs it"]
async fn etcd_snapshot_throughput_against_curl() {
    let mib: u64 = std::env::var("PLINTH_BENCH_SNAPSHOT_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let rounds: usize = std::env::var("PLINTH_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let bytes = mib << 20;
    let root = tempfile::tempdir().expect("s3 root");
    let s3 = S3::start(root.path(), "snaps").await;
    let lab = Lab::start(
        Backend::Sqlite,
        26,
        "{every: 6h, keep: 1, store: \"s3://snaps/bench\"}",
        |dir| s3.config(dir),
        bytes,
    )
    .await;
    // etcd's revision is at least its number of keys: a database past ~1 GiB holds more than
    // a million, so the generated one needs a later revision.
    let revision = 1_000_000u64.max(bytes / 512);
    lab.etcd.lock().expect("etcd").revision = revision;
    let config = lab.process_config();
    // The Plinth binary measured: `PLINTH_BENCH_BIN` (the script's `cargo build --release`),
    // else the test build's.
    let bin = std::env::var("PLINTH_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_plinth")));
    let server = crate::cli::serve_bin(
        &bin,
        lab.tmp.path(),
        &[
            "--config",
            config.to_str().expect("p"),
            "--database-url",
            &lab.srv.db.url,
        ],
        &[],
    );
    // The same bytes a node streams, in a file for curl.
    let plain = lab.tmp.path().join("snapshot.db");
    {
        use std::io::Write as _;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&plain).expect("file"));
        let db = crate::support::etcd_db::EtcdDb::new(bytes, revision);
        for c in db.chunks(1 << 20) {
            f.write_all(&c).expect("write");
        }
    }
    let size = std::fs::metadata(&plain).expect("meta").len() as f64;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3600))
        .build()
        .expect("client");
    let curl = |args: Vec<String>| {
        let started = std::time::Instant::now();
        let out = Command::new("curl")
            .args([
                "-sS",
                "-f",
                "-o",
                "/dev/null",
                "-H",
                "x-amz-content-sha256: UNSIGNED-PAYLOAD",
            ])
            .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
            .arg(format!("{}:{}", s3.key, s3.secret))
            .args(args)
            .output()
            .expect("curl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        started.elapsed().as_secs_f64()
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut plinth_s, mut up_s, mut down_s) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let started = std::time::Instant::now();
        let r = client
            .post(format!("{}/api/v1/clusters/lab/snapshots", server.base))
            .bearer_auth(&lab.srv.operator)
            .send()
            .await
            .expect("answer");
        let status = r.status();
        let mut body: Value = r.json().await.expect("json");
        // Longer than the request waits (240 s): followed to its end.
        while status == StatusCode::ACCEPTED && body["state"] == "taking" {
            tokio::time::sleep(Duration::from_millis(200)).await;
            body = client
                .get(format!(
                    "{}/api/v1/clusters/lab/snapshots/{}",
                    server.base,
                    body["id"].as_str().expect("id")
                ))
                .bearer_auth(&lab.srv.operator)
                .send()
                .await
                .expect("answer")
                .json()
                .await
                .expect("json");
        }
        assert_eq!(body["state"], "verified", "{body}");
        plinth_s.push(started.elapsed().as_secs_f64());
        let url = format!("{}/snaps/curl/round-{round}", s3.endpoint);
        up_s.push(curl(vec![
            "-T".into(),
            plain.display().to_string(),
            url.clone(),
        ]));
        down_s.push(curl(vec![url]));
    }
    let peak = vm_hwm(server.child.id());
    let (p, u, d) = (median(plinth_s), median(up_s), median(down_s));
    let mbs = |secs: f64| size / 1e6 / secs;
    println!("etcd snapshot benchmark: {mib} MiB, {rounds} rounds (medians), s3s-fs on loopback");
    println!("  plinth binary: {}", bin.display());
    println!("  plinth peak RSS (VmHWM): {} MiB", peak >> 20);
    println!(
        "  plinth snapshot (stream+check+seal+upload+read back+verify): {:.2} s  {:.1} MB/s",
        p,
        mbs(p)
    );
    println!(
        "  curl upload of the same bytes (clear):                        {:.2} s  {:.1} MB/s",
        u,
        mbs(u)
    );
    println!(
        "  curl upload + download (what plinth's verification adds):    {:.2} s  {:.1} MB/s",
        u + d,
        mbs(u + d)
    );
    println!(
        "  ratio plinth / curl upload:            {:.2}",
        mbs(p) / mbs(u)
    );
    println!(
        "  ratio plinth / curl upload+download:   {:.2}",
        mbs(p) / mbs(u + d)
    );
    drop(server);
    lab.finish().await;
    drop(s3);
}

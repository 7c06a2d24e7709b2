//! `plinth doctor` as an operator runs it (issue 16, item 9): on a fresh settings file it names
//! what is wrong, one line per check with the fix, and creates nothing; after `migrate` and
//! `apply` it finds the interface that does not exist, the port another process holds, the
//! missing iPXE binary, the Talos image not in the cache and the BMC that does not answer (a
//! closed loopback port), and fails; beside a running server, with a real Redfish BMC
//! (sushy-emulator over TLS with a pinned certificate and a password), every check passes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::cli::plinth;
use crate::support::bmc_peers::{sushy_emulator, EmulatorSetup};
use crate::support::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_plinth");

/// The checks of a `doctor --json` run, and its exit status.
fn doctor(dir: &Path, config: &Path) -> (i32, Vec<Value>, String) {
    let (code, out, err) = plinth(
        dir,
        &[
            "doctor",
            "--json",
            "--bmc-timeout",
            "3",
            "--config",
            config.to_str().expect("utf-8"),
        ],
        &[],
    );
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let checks = v["checks"].as_array().expect("checks").clone();
    assert_eq!(
        v["summary"]["fail"].as_u64().expect("summary") as usize,
        checks.iter().filter(|c| c["status"] == "fail").count()
    );
    (code, checks, err)
}

/// The one check whose name contains `what`.
fn check<'a>(checks: &'a [Value], what: &str) -> &'a Value {
    let found: Vec<&Value> = checks
        .iter()
        .filter(|c| c["check"].as_str().is_some_and(|n| n.contains(what)))
        .collect();
    assert_eq!(found.len(), 1, "one check `{what}` in {checks:#?}");
    found[0]
}

fn status_of<'a>(checks: &'a [Value], what: &str) -> &'a str {
    check(checks, what)["status"].as_str().expect("status")
}

/// Every file and directory under `dir`, relative.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).expect("under").display().to_string());
            if p.is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn doctor_names_what_an_operator_gets_wrong() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let data = dir.join("data");
    let ipxe = dir.join("ipxe");
    std::fs::create_dir_all(&ipxe).expect("ipxe dir");
    // Only the BIOS binary: UEFI x86_64 is missing (fail, DHCP is on), ARM64 too (a warning).
    std::fs::write(ipxe.join("undionly.kpxe"), b"not empty").expect("ipxe");
    // Another process holds the DHCP port: this test does.
    let dhcp_port = free_port();
    let held = std::net::UdpSocket::bind(("0.0.0.0", dhcp_port)).expect("hold the DHCP port");
    let http_port = free_port();
    let config = dir.join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{data}\"\n\
             [http]\nlisten = \"127.0.0.1:{http_port}\"\n\
             [boot]\nipxe_dir = \"{ipxe}\"\npublic_url = \"http://127.0.0.1:{http_port}\"\n\
             [dhcp]\nenabled = true\nport = {dhcp_port}\nproxy_port = 0\ninterfaces = [\"plinth-nope0\"]\n\
             [[dhcp.subnet]]\ncidr = \"192.0.2.0/24\"\nserver_ip = \"192.0.2.1\"\npool = [\"192.0.2.100-192.0.2.200\"]\n",
            data = data.display(),
            ipxe = ipxe.display(),
        ),
    )
    .expect("config");

    // A fresh settings file: the database and key do not exist yet, and doctor creates neither.
    let before = tree(dir);
    let (code, checks, _) = doctor(dir, &config);
    assert_ne!(code, 0, "{checks:#?}");
    assert_eq!(tree(dir), before, "doctor only reads");
    assert_eq!(status_of(&checks, "database"), "warn");
    assert!(check(&checks, "database")["fix"]
        .as_str()
        .is_some_and(|f| f.contains("plinth migrate")));
    assert_eq!(status_of(&checks, "secret key"), "warn");

    // The interface named in the config does not exist: the fix names the setting.
    let iface = check(&checks, "interface plinth-nope0");
    assert_eq!(iface["status"], "fail", "{iface}");
    assert!(
        iface["fix"]
            .as_str()
            .is_some_and(|f| f.contains("dhcp.interfaces")),
        "{iface}"
    );
    // The port another process holds: named, with the process.
    let port = check(
        &checks,
        &format!("DHCP 0.0.0.0:{dhcp_port}/udp (dhcp.port)"),
    );
    assert_eq!(port["status"], "fail", "{port}");
    assert!(
        port["detail"]
            .as_str()
            .is_some_and(|d| d.contains(&format!("pid {}", std::process::id()))),
        "{port}"
    );
    assert!(port["fix"]
        .as_str()
        .is_some_and(|f| f.contains("dhcp.port")));
    assert_eq!(
        status_of(&checks, &format!("HTTP 127.0.0.1:{http_port}/tcp")),
        "ok"
    );
    // A loopback boot URL cannot be reached by a booting machine.
    assert_eq!(status_of(&checks, "boot.public_url"), "fail");
    // server_ip 192.0.2.1 is not an address of this host.
    assert_eq!(status_of(&checks, "dhcp.subnet[0].server_ip"), "warn");
    // iPXE per firmware.
    assert_eq!(status_of(&checks, "iPXE for bios"), "ok");
    let efi = check(&checks, "iPXE for uefi-x86_64");
    assert_eq!(efi["status"], "fail", "{efi}");
    assert!(efi["fix"]
        .as_str()
        .is_some_and(|f| f.contains("ipxe/fetch.sh")));
    assert_eq!(status_of(&checks, "iPXE for uefi-arm64"), "warn");
    // Every failed check says how to fix it.
    for c in checks.iter().filter(|c| c["status"] != "ok") {
        assert!(c["fix"].as_str().is_some_and(|f| !f.is_empty()), "{c}");
    }

    // Migrate, declare a cluster (its image is not cached, no factory) and a machine whose BMC
    // listens nowhere (a loopback port that was just closed).
    let (code, _, err) = plinth(
        dir,
        &["migrate", "--config", config.to_str().expect("utf-8")],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let secrets = dir.join("secrets/lab.yaml");
    let (code, _, err) = plinth(
        dir,
        &[
            "cluster",
            "init",
            "lab",
            "--endpoint",
            "https://192.0.2.10:6443",
            "--out",
            secrets.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let inv = dir.join("inv");
    std::fs::create_dir_all(&inv).expect("inv");
    let closed = free_port();
    std::fs::write(
        inv.join("lab.yaml"),
        format!(
            "kind: Cluster\nname: lab\nendpoint: https://192.0.2.10:6443\ntalosVersion: v1.11.6\nsecrets: {}\n\
             patches:\n  - machine:\n      install:\n        disk: /dev/sda\n\
             ---\nkind: Machine\nhostname: w-1\nrole: worker\ncluster: lab\n\
             interfaces:\n  - mac: \"52:54:00:00:d0:01\"\n    boot: true\n\
             bmc:\n  url: http://127.0.0.1:{closed}\n  username: root\n  tls: insecure-http\n",
            secrets.display()
        ),
    )
    .expect("inventory");
    let (code, _, err) = plinth(
        dir,
        &[
            "apply",
            inv.to_str().expect("utf-8"),
            "--config",
            config.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    // The key `apply` created beside the database is what doctor checks next.
    let (code, checks, _) = doctor(dir, &config);
    assert_ne!(code, 0);
    assert_eq!(status_of(&checks, "database"), "ok", "{checks:#?}");
    assert_eq!(status_of(&checks, "secret key"), "ok", "{checks:#?}");
    let image = check(&checks, "Talos image of cluster lab");
    assert_eq!(image["status"], "fail", "{image}");
    assert!(
        image["fix"]
            .as_str()
            .is_some_and(|f| f.contains("plinth image pull --version v1.11.6")),
        "{image}"
    );
    let bmc = check(&checks, "BMC of w-1");
    assert_eq!(bmc["status"], "fail", "{bmc}");
    assert!(
        bmc["check"]
            .as_str()
            .is_some_and(|c| c.contains("tls insecure-http")),
        "{bmc}"
    );
    // Text output: one line per check, status first, the fix on the same line.
    let (code, out, _) = plinth(
        dir,
        &[
            "doctor",
            "--no-bmc",
            "--config",
            config.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        out.lines()
            .any(|l| l.starts_with("fail  interface plinth-nope0")
                && l.contains("; fix: set dhcp.interfaces")),
        "{out}"
    );
    assert!(!out.contains("BMC of"), "--no-bmc: {out}");

    // Another key than the one the database's secrets are sealed with: refused, restore it.
    let key = data.join("secret.key");
    let original = std::fs::read(&key).expect("key");
    std::fs::remove_file(&key).expect("rm key");
    crate::support::write_key(&key);
    let (code, checks, _) = doctor(dir, &config);
    assert_ne!(code, 0);
    let k = check(&checks, "secret key");
    assert_eq!(k["status"], "fail", "{k}");
    assert!(
        k["detail"].as_str().is_some_and(|d| d.contains("fingerprint"))
            && k["fix"].as_str().is_some_and(|f| f.contains("backup")),
        "{k}"
    );
    // No key at all over sealed secrets: a failure too, never a new key.
    std::fs::remove_file(&key).expect("rm key");
    let (_, checks, _) = doctor(dir, &config);
    assert_eq!(status_of(&checks, "secret key"), "fail", "{checks:#?}");
    assert!(!key.exists(), "doctor created a key");
    std::fs::write(&key, original).expect("restore key");
    drop(held);
}

/// A server process started on a settings file, killed (by PID) when dropped.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path, config: &Path) -> (Served, String) {
    let mut child = Command::new(BIN)
        .current_dir(dir)
        .args(["serve", "--config", config.to_str().expect("utf-8")])
        .env_remove("PLINTH_SECRET_KEY")
        .env_remove("PLINTH_DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn plinth");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("serving HTTP on ").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server announces its address");
    (Served(child), base)
}

#[test]
fn doctor_passes_beside_a_running_server_with_a_real_bmc() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let data = dir.join("data");
    let ipxe = dir.join("ipxe");
    // The iPXE binaries as the README has them fetched (Debian's ipxe package).
    let fetched = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("ipxe/fetch.sh"))
        .arg(&ipxe)
        .output()
        .expect("run ipxe/fetch.sh");
    assert!(
        fetched.status.success(),
        "ipxe/fetch.sh (apt-get install ipxe): {}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    let http_port = free_port();
    let config = dir.join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[http]\nlisten = \"127.0.0.1:{http_port}\"\n[boot]\nipxe_dir = \"{}\"\n",
            data.display(),
            ipxe.display()
        ),
    )
    .expect("config");
    let (_server, base) = serve(dir, &config);
    let (code, token, err) = plinth(
        dir,
        &[
            "token",
            "create",
            "--role",
            "admin",
            "--name",
            "doctor",
            "--config",
            config.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let token = token.trim().to_string();

    // A real BMC: sushy-emulator over TLS with a self-signed certificate, pinned, and a password.
    let emu = sushy_emulator(EmulatorSetup {
        auth: Some(("admin".into(), "doctor-pw".into())),
        tls: true,
    });
    let fingerprint = emu.fingerprint.clone().expect("TLS fingerprint");
    let resp = reqwest::blocking::Client::new()
        .post(format!("{base}/api/v1/machines"))
        .bearer_auth(&token)
        .json(&json!({
            "hostname": "bmc-1",
            "interfaces": [{"mac": "52:54:00:00:d0:02", "boot": true}],
            "bmc": {"url": emu.peer.url(), "username": "admin", "password": "doctor-pw",
                    "tls": "pinned", "fingerprint": fingerprint},
        }))
        .send()
        .expect("register");
    assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text());

    let (code, checks, err) = doctor(dir, &config);
    let failed: Vec<&Value> = checks.iter().filter(|c| c["status"] == "fail").collect();
    assert!(failed.is_empty() && code == 0, "{failed:#?}\n{err}");
    // The HTTP port is held, by the running plinth: that is fine.
    let http = check(&checks, &format!("HTTP 127.0.0.1:{http_port}/tcp"));
    assert_eq!(http["status"], "ok");
    assert!(
        http["detail"]
            .as_str()
            .is_some_and(|d| d.contains("held by a running plinth")),
        "{http}"
    );
    for what in [
        "database",
        "secret key",
        "capabilities",
        "iPXE for bios",
        "iPXE for uefi-x86_64",
    ] {
        assert_eq!(status_of(&checks, what), "ok", "{what}: {checks:#?}");
    }
    let bmc = check(&checks, "BMC of bmc-1");
    assert_eq!(bmc["status"], "ok", "{bmc}");
    assert!(
        bmc["check"]
            .as_str()
            .is_some_and(|c| c.contains("tls pinned"))
            && bmc["detail"]
                .as_str()
                .is_some_and(|d| d.contains("credentials accepted")),
        "{bmc}"
    );

    // The same BMC with a wrong pin: refused over TLS, and the fix says how to pin it.
    let other = "ab".repeat(32);
    let m: Value = reqwest::blocking::Client::new()
        .get(format!("{base}/api/v1/machines/bmc-1"))
        .bearer_auth(&token)
        .send()
        .expect("get")
        .json()
        .expect("json");
    let resp = reqwest::blocking::Client::new()
        .patch(format!("{base}/api/v1/machines/bmc-1"))
        .bearer_auth(&token)
        .header("If-Match", format!("\"{}\"", m["version"]))
        .header("Content-Type", "application/merge-patch+json")
        .body(json!({"bmc": {"fingerprint": other}}).to_string())
        .send()
        .expect("edit");
    assert!(resp.status().is_success(), "{:?}", resp.text());
    let (code, checks, _) = doctor(dir, &config);
    assert_ne!(code, 0);
    let bmc = check(&checks, "BMC of bmc-1");
    assert_eq!(bmc["status"], "fail", "{bmc}");
    assert!(
        bmc["fix"]
            .as_str()
            .is_some_and(|f| f.contains("bmc.fingerprint")),
        "{bmc}"
    );
}

/// PostgreSQL: a server that does not answer fails; a fresh database is reachable but not
/// migrated (a warning naming `plinth migrate`), then migrated; a missing key file fails; and
/// nothing of it is created by doctor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_a_postgresql_database() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let config = dir.join("plinth.toml");
    let key = dir.join("secret.key");
    let settings = |url: &str| {
        format!(
            "data_dir = \"{}\"\n[database]\nurl = \"{url}\"\n[secrets]\nkey_file = \"{}\"\n",
            dir.join("data").display(),
            key.display()
        )
    };
    let run = |config: std::path::PathBuf| {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || doctor(&dir, &config))
    };

    // Nobody listens there.
    let closed = free_port();
    std::fs::write(
        &config,
        settings(&format!("postgres://postgres@127.0.0.1:{closed}/plinth")),
    )
    .expect("config");
    let (code, checks, _) = run(config.clone()).await.expect("join");
    assert_ne!(code, 0);
    assert_eq!(status_of(&checks, "database"), "fail", "{checks:#?}");
    // The key file named does not exist: refused, and not created.
    assert_eq!(status_of(&checks, "secret key"), "fail", "{checks:#?}");
    assert!(!key.exists());

    // A fresh database: reachable, not migrated.
    let db = crate::support::TestDb::new(crate::support::Backend::Postgres).await;
    crate::support::write_key(&key);
    std::fs::write(&config, settings(&db.url)).expect("config");
    let (_, checks, _) = run(config.clone()).await.expect("join");
    let d = check(&checks, "database");
    assert_eq!(d["status"], "warn", "{d}");
    assert!(
        d["detail"]
            .as_str()
            .is_some_and(|t| t.contains("not migrated")),
        "{d}"
    );
    assert!(
        d["fix"]
            .as_str()
            .is_some_and(|t| t.contains("plinth migrate")),
        "{d}"
    );
    // Still not migrated: doctor only reads.
    let (_, checks, _) = run(config.clone()).await.expect("join");
    assert_eq!(status_of(&checks, "database"), "warn");

    // Migrated: ok, and the key is ok over it.
    let (code, _, err) = plinth(
        dir,
        &["migrate", "--config", config.to_str().expect("utf-8")],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (_, checks, _) = run(config.clone()).await.expect("join");
    assert_eq!(status_of(&checks, "database"), "ok", "{checks:#?}");
    assert_eq!(status_of(&checks, "secret key"), "ok", "{checks:#?}");
    db.drop_db().await;
}

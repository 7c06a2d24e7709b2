//! Talos machine configs end to end: the example `inventory/` directory through `plinth apply`
//! (dry run, apply, idempotence, diffs with secrets redacted, refusals), `plinth config render`
//! validated against the shared Talos schemas, and config delivery over HTTP on both backends:
//! right token, wrong token, wrong UUID, wrong source address, expired window, replay after the
//! window closed, and the boot script that mints the token.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{self, Ask as _, Backend, TestServer};
use plinth::talos::validate::SchemaValidator;
use plinth::talos::{MachineConfig, TalosVersion};

const BIN: &str = env!("CARGO_BIN_EXE_plinth");

use crate::support::shared;

pub(crate) fn schemas() -> PathBuf {
    shared().join("talos/schemas")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir").flatten() {
        let p = e.path();
        let t = to.join(e.file_name());
        if p.is_dir() {
            copy_dir(&p, &t);
        } else {
            std::fs::copy(&p, &t).expect("copy");
        }
    }
}

/// The CLI over one config file, with the environment's settings removed.
pub(crate) struct Cli {
    pub(crate) config: PathBuf,
}

impl Cli {
    pub(crate) fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(BIN)
            .env_remove("PLINTH_SECRET_KEY")
            .env_remove("PLINTH_DATABASE_URL")
            .env_remove("PLINTH_CONFIG")
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .expect("plinth runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub(crate) fn ok(&self, args: &[&str]) -> (String, String) {
        let (ok, out, err) = self.run(args);
        assert!(ok, "plinth {args:?} failed:\n{err}\n{out}");
        (out, err)
    }
}

/// The repository's example directory in a temp dir, its cluster's secrets written by `plinth
/// cluster init` next to (outside) it.
fn example(tmp: &Path) -> (Cli, PathBuf, String) {
    let inv = tmp.join("inventory");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("inventory"),
        &inv,
    );
    let secrets = tmp.join("prod-secrets.yaml");
    let out = Command::new(BIN)
        .args([
            "cluster",
            "init",
            "prod",
            "--endpoint",
            "https://10.20.0.10:6443",
            "--out",
        ])
        .arg(&secrets)
        .output()
        .expect("cluster init");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cluster = inv.join("clusters/prod.yaml");
    let text = std::fs::read_to_string(&cluster).expect("cluster file");
    std::fs::write(
        &cluster,
        text.replace(
            "/etc/plinth/secrets/prod.yaml",
            &secrets.display().to_string(),
        ),
    )
    .expect("write");
    let config = tmp.join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[talos]\nschema_dir = \"{}\"\n",
            tmp.join("data").display(),
            schemas().display()
        ),
    )
    .expect("config");
    let bundle = std::fs::read_to_string(&secrets).expect("bundle");
    (Cli { config }, inv, bundle)
}

/// Private-key material of a bundle: base64 values under `key:` and the tokens.
fn secret_values(bundle: &str) -> Vec<String> {
    bundle
        .lines()
        .filter_map(|l| {
            let t = l.trim();
            [
                "key:",
                "token:",
                "bootstraptoken:",
                "secretboxencryptionsecret:",
                "secret:",
            ]
            .iter()
            .find_map(|k| t.strip_prefix(k))
            .map(|v| v.trim().to_string())
        })
        .filter(|v| v.len() >= 16)
        .collect()
}

#[test]
fn example_inventory_applies_renders_and_diffs() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (cli, inv, bundle) = example(tmp.path());
    let inv_s = inv.to_str().expect("utf-8");
    let secrets = secret_values(&bundle);
    assert!(secrets.len() >= 6, "bundle has keys and tokens");

    // A dry run only reads: before the server (or `migrate`) made the database and the key, it
    // refuses, names what it looked for, and creates nothing.
    let data = tmp.path().join("data");
    let (ok, _, err) = cli.run(&["apply", inv_s, "--dry-run"]);
    assert!(
        !ok && err.contains("no database at") && err.contains("created nothing"),
        "{err}"
    );
    assert!(!data.exists(), "a dry run created {}", data.display());
    let (_, err) = cli.ok(&["migrate"]);
    assert!(err.contains("did not exist and was created now"), "{err}");
    let (ok, _, err) = cli.run(&["apply", inv_s, "--dry-run"]);
    assert!(!ok && err.contains("no secret key at"), "{err}");
    assert!(
        !data.join("secret.key").exists(),
        "a dry run created the key"
    );
    let (key, _) = cli.ok(&["secret-key"]);
    {
        use std::io::Write as _;
        #[cfg(unix)]
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new();
        f.write(true).create_new(true);
        #[cfg(unix)]
        f.mode(0o600);
        f.open(data.join("secret.key"))
            .and_then(|mut f| f.write_all(key.as_bytes()))
            .expect("key");
    }

    // Dry run: everything is new; a summary per object and per machine, nothing is written.
    let (out, err) = cli.ok(&["apply", inv_s, "--dry-run"]);
    for line in [
        "create    Cluster prod",
        "create    Profile dell-r650",
        "create    Site fra1",
        "create    Rack r12",
        "create    Machine cp-1",
        "create    Machine worker-1",
        "config    changes   cp-3",
        "config    changes   worker-1",
        "8 object(s): 8 new, 0 changed, 0 unchanged; 4 of 4 machine config(s) change (--diff shows how)",
    ] {
        assert!(out.contains(line), "dry run lists `{line}`:\n{out}");
    }
    assert!(!out.contains("+++"), "no diffs without --diff:\n{out}");
    assert!(err.contains("plinth: database SQLite "), "{err}");
    assert!(
        err.contains("dry run: 8 change(s), 4 machine config(s)"),
        "{err}"
    );
    // With --diff, every machine's whole config shows too.
    let (diffs, _) = cli.ok(&["apply", inv_s, "--dry-run", "--diff"]);
    assert!(diffs.contains("+++ cp-3 (after)") && diffs.contains("+  type: controlplane"));
    // With --json, the same as one object.
    let (j, _) = cli.ok(&["apply", inv_s, "--dry-run", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&j).expect("json");
    assert_eq!(j["counts"]["create"], 8, "{j}");
    assert_eq!(j["config_changes"], 4, "{j}");
    assert_eq!(j["machines"].as_array().map(Vec::len), Some(4), "{j}");
    assert!(j.get("diffs").is_none(), "diffs only with --diff: {j}");
    for s in &secrets {
        assert!(
            !out.contains(s.as_str()) && !err.contains(s.as_str()) && !diffs.contains(s.as_str()),
            "a secret leaked into the dry run"
        );
    }
    let (ok, _, err) = cli.run(&["config", "render", "cp-1"]);
    assert!(
        !ok && err.contains("cp-1"),
        "nothing was written by the dry run: {err}"
    );

    // Apply, then again: idempotent.
    let (_, err) = cli.ok(&["apply", inv_s]);
    assert!(err.contains("applied: 8 change(s)"), "{err}");
    let (out, err) = cli.ok(&["apply", inv_s]);
    assert!(
        !out.contains("create") && !out.contains("update") && !out.contains("+++"),
        "{out}"
    );
    assert!(
        err.contains("applied: 0 change(s), 0 machine config(s)"),
        "{err}"
    );

    // Render: valid for its version, facts written, install disk pinned by serial (never a
    // device name), the data disk never chosen.
    let (yaml, err) = cli.ok(&["config", "render", "cp-2"]);
    assert!(
        err.contains("install disk: disks[0] pinned by serial S6EXNA0T100002"),
        "{err}"
    );
    let cfg = MachineConfig::parse(&yaml).expect("rendered YAML parses");
    let v = SchemaValidator::load(
        &schemas().join("config.schema.v1.11.6.json"),
        TalosVersion::new(1, 11, 6),
    )
    .expect("schema");
    let errors: Vec<_> = plinth::talos::validate::validate(&cfg, &v)
        .err()
        .map(|r| r.errors)
        .unwrap_or_default();
    assert!(errors.is_empty(), "{errors:?}");
    let doc = cfg.v1alpha1().expect("v1alpha1");
    assert_eq!(doc["machine"]["type"], "controlplane");
    assert_eq!(doc["machine"]["network"]["hostname"], "cp-2");
    assert_eq!(
        doc["machine"]["install"]["diskSelector"]["serial"],
        "S6EXNA0T100002"
    );
    assert!(
        doc["machine"]["install"].get("disk").is_none(),
        "no /dev name"
    );
    assert_eq!(
        doc["cluster"]["etcd"]["advertisedSubnets"][0], "10.20.0.0/24",
        "control-plane role patch"
    );
    assert_eq!(doc["machine"]["time"]["servers"][0], "time.cloudflare.com");
    let (w, werr) = cli.ok(&["config", "render", "worker-1"]);
    // Inventory kernel args reach the install boot only; Talos 1.11 without
    // machine.install.extraKernelArgs does not keep them, and render says so.
    assert!(
        werr.contains("kernelArgs `net.ifnames=0 intel_iommu=on` apply to the install boot only")
            && werr.contains("machine.install.extraKernelArgs"),
        "{werr}"
    );
    let wdoc = MachineConfig::parse(&w).expect("worker");
    let wdoc = wdoc.v1alpha1().expect("v1alpha1");
    assert_eq!(wdoc["machine"]["type"], "worker");
    assert!(
        wdoc["cluster"].get("etcd").is_none(),
        "role patch is control-plane only"
    );
    assert_eq!(wdoc["machine"]["nodeLabels"]["plinth.dev/gpu"], "false");
    assert_eq!(wdoc["machine"]["ca"]["key"], "", "workers carry no CA key");

    // A change to a shared patch shows as a diff of every affected machine, secrets redacted.
    let p = inv.join("patches/cluster-time.yaml");
    let t = std::fs::read_to_string(&p).expect("patch");
    std::fs::write(&p, t.replace("time.cloudflare.com", "ntp.fra1.example")).expect("write");
    let (out, _) = cli.ok(&["apply", inv_s, "--dry-run", "--diff"]);
    assert!(out.contains("update    Cluster prod"), "{out}");
    assert_eq!(out.matches("+    - ntp.fra1.example").count(), 4, "{out}");
    assert_eq!(
        out.matches("-    - time.cloudflare.com").count(),
        4,
        "{out}"
    );
    for s in &secrets {
        assert!(!out.contains(s.as_str()), "a secret leaked into the diff");
    }
    // `config diff`: nothing was served yet, so the whole config shows (redacted).
    let (d, err) = cli.ok(&["config", "diff", "worker-1"]);
    assert!(err.contains("no config has been served yet"), "{err}");
    assert!(d.contains("<redacted sha256:"), "{d}");
    for s in &secrets {
        assert!(!d.contains(s.as_str()), "a secret leaked into config diff");
    }

    // Refusals, nothing written: a secrets file inside the directory; a bad patch; a rule that
    // would pick a data disk, with the candidates listed.
    let inside = inv.join("secrets.yaml");
    std::fs::copy(tmp.path().join("prod-secrets.yaml"), &inside).expect("copy");
    let c = inv.join("clusters/prod.yaml");
    let ctext = std::fs::read_to_string(&c).expect("cluster");
    let outside = tmp.path().join("prod-secrets.yaml").display().to_string();
    std::fs::write(&c, ctext.replace(&outside, "../secrets.yaml")).expect("write");
    let (ok, _, err) = cli.run(&["apply", inv_s]);
    assert!(
        !ok && err.contains("lies inside the inventory directory"),
        "{err}"
    );
    std::fs::write(&c, &ctext).expect("restore");
    std::fs::remove_file(&inside).expect("rm");

    let prof = inv.join("profiles/dell-r650.yaml");
    let ptext = std::fs::read_to_string(&prof).expect("profile");
    std::fs::write(&prof, ptext.replace(", \"<= 1TB\"", "")).expect("write");
    let (ok, _, err) = cli.run(&["apply", inv_s]);
    assert!(!ok, "a rule matching data disks is refused");
    // Named where the rule is written (the profile's installDisk), with the machine it stops.
    assert!(
        err.lines()
            .any(|l| l.starts_with("error: profiles/dell-r650.yaml:")
                && l.contains(": installDisk: the install-disk rules match data disk(s) disks[1]")
                && l.contains("candidates:")
                && l.contains("cp-1")),
        "{err}"
    );
    assert!(err.contains("nothing was applied"), "{err}");
    std::fs::write(&prof, &ptext).expect("restore");

    std::fs::write(
        inv.join("patches/cluster-time.yaml"),
        "machine: [not, a, mapping\n",
    )
    .expect("write");
    let (ok, _, err) = cli.run(&["apply", inv_s]);
    assert!(!ok && err.contains("patches/cluster-time.yaml"), "{err}");
}

/// Apply an inventory in `dir` straight through the library, on the server's database.
pub(crate) async fn apply_dir(srv: &TestServer, extra: &str, dir: &Path) {
    let cfg = support::config(&srv.db, extra);
    let store = plinth::app::open_store(&cfg, false).await.expect("store");
    let secrets = plinth::app::secret_box(&cfg).expect("key");
    let configs = plinth::app::config_service(&store, secrets.clone(), Some(schemas()));
    let inv = plinth::app::inventory(&store, secrets);
    let declared = plinth::declare::load(dir).expect("directory loads");
    let r = plinth::service::apply::apply(&configs, &inv, declared, false, "test")
        .await
        .expect("apply");
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

pub(crate) const UUID: &str = "5b6c2a1e-8f3d-4c2b-9a7e-0d1f2e3c4b5a";
pub(crate) const MAC: &str = "52:54:00:aa:bb:01";

/// A fresh Talos secrets bundle written to `dir/secrets.yaml`: its path.
pub(crate) fn write_secrets(dir: &Path) -> PathBuf {
    let secrets = dir.join("secrets.yaml");
    std::fs::write(
        &secrets,
        plinth::talos::secrets::SecretsBundle::generate()
            .expect("bundle")
            .to_yaml()
            .expect("yaml"),
    )
    .expect("write secrets");
    secrets
}

pub(crate) fn write_inventory(dir: &Path, secrets: &Path, reserved: Option<&str>) {
    let inv = dir.join("inv");
    std::fs::create_dir_all(&inv).expect("mkdir");
    std::fs::write(
        inv.join("all.yaml"),
        format!(
            r#"kind: Cluster
name: lab
endpoint: https://10.88.0.10:6443
talosVersion: v1.12.11
secrets: {secrets}
---
kind: Profile
name: vm
installDisk:
  type: ssd
---
kind: Machine
hostname: node-1
smbios_uuid: {UUID}
role: worker
cluster: lab
profile: vm
interfaces:
  - mac: "{MAC}"
    boot: true{ip}
disks:
  - serial: QM00001
    type: ssd
    size_bytes: 21474836480
"#,
            secrets = secrets.display(),
            ip = reserved
                .map(|a| format!("\n    ipv4: {a}"))
                .unwrap_or_default()
        ),
    )
    .expect("inventory");
}

pub(crate) async fn fetch(
    srv: &TestServer,
    id: &str,
    token: &str,
    uuid: &str,
) -> (StatusCode, String) {
    fetch_from(srv, "127.0.0.1", id, token, uuid).await
}

/// A client whose requests leave from `local` (a loopback address: the server tells requesters
/// apart by address).
fn client_from(local: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(Some(local.parse().expect("ip")))
        .build()
        .expect("client")
}

/// A config fetch from the loopback address `local`.
pub(crate) async fn fetch_from(
    srv: &TestServer,
    local: &str,
    id: &str,
    token: &str,
    uuid: &str,
) -> (StatusCode, String) {
    let r = client_from(local)
        .get(srv.url(&format!("/config/{id}?token={token}&uuid={uuid}")))
        .answer()
        .await;
    let status = r.status;
    (status, r.text)
}

pub(crate) async fn boot_script(srv: &TestServer) -> String {
    boot_script_from(srv, "127.0.0.1").await
}

/// The machine's boot script as requested from the loopback address `local`.
pub(crate) async fn boot_script_from(srv: &TestServer, local: &str) -> String {
    client_from(local)
        .get(srv.url(&format!(
            "/boot/machine.ipxe?mac={}&uuid={UUID}&buildarch=x86_64&platform=efi",
            MAC.replace(':', "-")
        )))
        .answer()
        .await
        .text
}

pub(crate) fn token_of(script: &str) -> String {
    let at = script.find("token=").expect("script carries a token") + "token=".len();
    script[at..]
        .split(['&', ' ', '\n'])
        .next()
        .expect("token")
        .to_string()
}

pub(crate) async fn events(srv: &TestServer, id: &str, kind: &str) -> Vec<Value> {
    let v: Value = srv
        .req(
            Method::GET,
            &format!("/api/v1/events?machine={id}&kind={kind}"),
            &srv.viewer,
        )
        .answer()
        .await
        .json();
    v.as_array().cloned().unwrap_or_default()
}

async fn config_delivery(b: Backend) {
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
    apply_dir(&srv, &extra, &tmp.path().join("inv")).await;

    let m: Value = srv
        .req(Method::GET, "/api/v1/machines/node-1", &srv.viewer)
        .answer()
        .await
        .json();
    let id = m["id"].as_str().expect("id").to_string();

    // The operator's view: renders, valid, pinned; never the config itself.
    let st: Value = srv
        .req(
            Method::GET,
            &format!("/api/v1/machines/{id}/config"),
            &srv.viewer,
        )
        .answer()
        .await
        .json();
    assert_eq!(st["valid"], true, "{st}");
    assert_eq!(st["window_open"], false);
    assert!(
        st["install_disk"]
            .as_str()
            .unwrap_or("")
            .contains("serial QM00001"),
        "{st}"
    );
    assert!(
        !st.to_string().contains("BEGIN"),
        "no key material in the status"
    );

    // No window: 404, and the refusal is an event.
    let (s, body) = fetch(&srv, &id, "nothing", UUID).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(body.is_empty(), "no detail in refusals");
    // Registered machines hold at boot; no token anywhere.
    assert!(!boot_script(&srv).await.contains("token="));

    // A registered machine cannot provision before it is ready: 409 naming the state.
    let r = srv
        .req(
            Method::POST,
            &format!("/api/v1/machines/{id}/provision"),
            &srv.operator,
        )
        .json(&json!({}))
        .answer()
        .await
        .expect_status(StatusCode::CONFLICT);
    assert!(r.text.contains("registered"));
    srv.req(
        Method::POST,
        &format!("/api/v1/machines/{id}/state"),
        &srv.operator,
    )
    .json(&json!({"state": "ready"}))
    .answer()
    .await
    .expect_status(StatusCode::OK);

    // Opening the window needs an operator.
    srv.req(
        Method::POST,
        &format!("/api/v1/machines/{id}/provision"),
        &srv.viewer,
    )
    .json(&json!({}))
    .answer()
    .await
    .expect_status(StatusCode::FORBIDDEN);
    let r = srv
        .req(
            Method::POST,
            &format!("/api/v1/machines/{id}/provision"),
            &srv.operator,
        )
        .json(&json!({"ttl_seconds": 5}))
        .answer()
        .await
        .expect_status(StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text.contains("ttl_seconds"));
    let r = srv
        .req(
            Method::POST,
            &format!("/api/v1/machines/{id}/provision"),
            &srv.operator,
        )
        .json(&json!({"ttl_seconds": 600}))
        .answer()
        .await
        .expect_status(StatusCode::OK);
    let opened: Value = r.json();
    let sha = opened["sha256"].as_str().expect("sha").to_string();

    // Without a cached image the machine holds and says why; with one it gets the install plan.
    let script = boot_script(&srv).await;
    assert!(script.contains("not in the image cache"), "{script}");
    let schematic = st["schematic_id"].as_str().expect("schematic").to_string();
    let cache = plinth::images::ImageCache::new(srv.data_dir.join("images"));
    let k = tmp.path().join("k");
    std::fs::write(&k, b"kernel").expect("k");
    for name in ["kernel-amd64", "initramfs-amd64.xz"] {
        cache
            .import(&schematic, "v1.12.11", name, &k)
            .expect("import");
    }
    let script = boot_script(&srv).await;
    assert!(
        script.contains("talos.platform=metal") && script.contains("pti=on"),
        "{script}"
    );
    // The kernel line carries Talos 1.12's own default arguments (DefaultArgs + quirks),
    // module.sig_enforce included, and not those of other releases.
    let kernel_line = script
        .lines()
        .find(|l| l.starts_with("kernel "))
        .unwrap_or_else(|| panic!("no kernel line: {script}"));
    let words: Vec<&str> = kernel_line.split(' ').collect();
    for arg in [
        "init_on_alloc=1",
        "slab_nomerge",
        "pti=on",
        "consoleblank=0",
        "nvme_core.io_timeout=4294967295",
        "printk.devkmsg=on",
        "selinux=1",
        "module.sig_enforce=1",
        "console=tty0",
    ] {
        assert!(words.contains(&arg), "{arg} missing: {kernel_line}");
    }
    assert!(
        !kernel_line.contains("proc_mem.force_override"),
        "a 1.13 argument on a 1.12 line: {kernel_line}"
    );
    assert!(
        script.contains(&format!("talos.config={}/config/{id}?token=", srv.base))
            && script.contains("&uuid=${uuid}"),
        "{script}"
    );
    let token = token_of(&script);
    assert!(token.len() >= 40);

    // Plinth neither leases nor reserves this machine's address here: the token is bound to the
    // address that asked for the script, and an event says the binding is weak.
    assert_eq!(
        events(&srv, &id, "config.token_bound_to_requester")
            .await
            .len(),
        1
    );
    // Every refusal is the same answer, whatever was wrong: a wrong token, a wrong UUID, no
    // UUID, the right token from another address.
    for (from, tok, uuid) in [
        ("127.0.0.1", "wrong-token", UUID),
        (
            "127.0.0.1",
            token.as_str(),
            "00000000-1111-2222-3333-444444444444",
        ),
        ("127.0.0.1", token.as_str(), ""),
        ("127.0.0.2", token.as_str(), UUID),
    ] {
        let (s, body) = fetch_from(&srv, from, &id, tok, uuid).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{from} {uuid}");
        assert!(body.is_empty(), "no detail in refusals");
    }
    // Right token, UUID and address: the config, byte for byte the render.
    let (s, yaml) = fetch(&srv, &id, &token, UUID).await;
    assert_eq!(s, StatusCode::OK);
    let got = plinth::service::machine_config::token_hash(&yaml);
    assert_eq!(
        got, sha,
        "served config is the one validated at window opening"
    );
    let cfg = MachineConfig::parse(&yaml).expect("parses");
    assert_eq!(cfg.v1alpha1().expect("doc")["machine"]["type"], "worker");
    let served = events(&srv, &id, "config.served").await;
    assert_eq!(served.len(), 1);
    assert_eq!(served[0]["detail"]["sha256"], sha);
    assert!(
        !served[0].to_string().contains(&token),
        "no token in events"
    );
    // A token serves once: a second fetch with it is refused and is an anomaly of its own.
    assert_eq!(
        fetch(&srv, &id, &token, UUID).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(events(&srv, &id, "config.token_reused").await.len(), 1);
    assert_eq!(
        events(&srv, &id, "config.fetch_from_foreign_address")
            .await
            .len(),
        1
    );
    assert_eq!(events(&srv, &id, "config.uuid_mismatch").await.len(), 1);
    let st: Value = srv
        .req(
            Method::GET,
            &format!("/api/v1/machines/{id}/config"),
            &srv.viewer,
        )
        .answer()
        .await
        .json();
    assert_eq!(st["served_sha256"], sha);
    assert_eq!(st["window_open"], true);
    let metrics = srv.client.get(srv.url("/metrics")).answer().await.text;
    assert!(
        metrics.contains("plinth_config_anomalies_total{kind=\"config.token_reused\"} 1"),
        "{metrics}"
    );

    // A new boot mints a new token: the old one is refused (replay).
    let token2 = token_of(&boot_script(&srv).await);
    assert_ne!(token, token2);
    assert_eq!(
        fetch(&srv, &id, &token, UUID).await.0,
        StatusCode::NOT_FOUND
    );

    // Expired window, then a token older than its lifetime: refused.
    let store = plinth::app::open_store(&support::config(&srv.db, &extra), false)
        .await
        .expect("store");
    let w = store
        .configs
        .window(id.parse().expect("id"))
        .await
        .expect("window")
        .expect("open");
    let mut expired = w.clone();
    expired.expires_at = chrono::Utc::now() - chrono::Duration::seconds(1);
    expired.opened_at = expired.expires_at - chrono::Duration::seconds(60);
    let ev = plinth::service::NewEvent {
        machine_id: None,
        kind: "test.expire".into(),
        actor: "test".into(),
        detail: json!({}),
    };
    store
        .configs
        .put_window(&expired, &ev)
        .await
        .expect("expire");
    assert_eq!(
        fetch(&srv, &id, &token2, UUID).await.0,
        StatusCode::NOT_FOUND
    );
    let mut stale = w.clone();
    stale.token_minted_at = w
        .token_minted_at
        .map(|t| t - plinth::service::machine_config::TOKEN_TTL);
    store.configs.put_window(&stale, &ev).await.expect("stale");
    assert_eq!(
        fetch(&srv, &id, &token2, UUID).await.0,
        StatusCode::NOT_FOUND
    );
    store.configs.put_window(&w, &ev).await.expect("reopen");
    assert_eq!(fetch(&srv, &id, &token2, UUID).await.0, StatusCode::OK);

    // Installed: the window closes; a token is refused, and the next network boot boots the
    // local disk.
    let token3 = token_of(&boot_script(&srv).await);
    srv.req(
        Method::POST,
        &format!("/api/v1/machines/{id}/state"),
        &srv.operator,
    )
    .json(&json!({"state": "installed"}))
    .answer()
    .await
    .expect_status(StatusCode::OK);
    assert_eq!(
        fetch(&srv, &id, &token3, UUID).await.0,
        StatusCode::NOT_FOUND
    );
    let script = boot_script(&srv).await;
    assert!(
        script.contains("exit") && !script.contains("token="),
        "{script}"
    );
    let refused = events(&srv, &id, "config.refused").await;
    let reasons: Vec<&str> = refused
        .iter()
        .filter_map(|e| e["detail"]["reason"].as_str())
        .collect();
    for want in [
        "no open provisioning window",
        "token does not match this boot's",
        "no SMBIOS UUID presented",
        "provisioning window expired",
        "token expired",
    ] {
        assert!(reasons.contains(&want), "{want} in {reasons:?}");
    }
    assert!(!events(&srv, &id, "config.window_closed").await.is_empty());

    // Closing by hand: DELETE, then a second DELETE is a 404.
    let r = srv
        .req(
            Method::DELETE,
            &format!("/api/v1/machines/{id}/provision"),
            &srv.operator,
        )
        .answer()
        .await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "already closed by `installed`"
    );

    // A reserved address that is not the requester's: the script request gets no token at all
    // (whoever knows the MAC cannot mint one), says why, and is an anomaly of the machine.
    write_inventory(tmp.path(), &secrets, Some("10.9.9.9"));
    apply_dir(&srv, &extra, &tmp.path().join("inv")).await;
    srv.req(
        Method::POST,
        &format!("/api/v1/machines/{id}/provision"),
        &srv.operator,
    )
    .json(&json!({}))
    .answer()
    .await
    .expect_status(StatusCode::OK);
    let script = boot_script(&srv).await;
    assert!(!script.contains("token="), "{script}");
    assert!(script.contains("machine's own address"), "{script}");
    assert_eq!(
        events(&srv, &id, "config.script_from_foreign_address")
            .await
            .len(),
        1
    );

    // An invalid config is never served: a machine patch the schema refuses stops the window
    // from opening, naming why.
    let inv = tmp.path().join("inv/all.yaml");
    let text = std::fs::read_to_string(&inv).expect("inv");
    std::fs::write(
        &inv,
        text.replace(
            "disks:\n",
            "patches:\n  - machine:\n      kubelet:\n        image: 42\n      network:\n        hostname: []\ndisks:\n",
        ),
    )
    .expect("write");
    let cfg = support::config(&srv.db, &extra);
    let store = plinth::app::open_store(&cfg, false).await.expect("store");
    let secrets_box = plinth::app::secret_box(&cfg).expect("key");
    let configs = plinth::app::config_service(&store, secrets_box.clone(), Some(schemas()));
    let declared = plinth::declare::load(&tmp.path().join("inv")).expect("loads");
    let report = plinth::service::apply::apply(
        &configs,
        &plinth::app::inventory(&store, secrets_box),
        declared,
        false,
        "test",
    )
    .await
    .expect("apply runs");
    assert!(!report.applied && !report.errors.is_empty(), "{report:?}");
    // The refusal names the layer that set the field and the rule that refuses it.
    let all = format!("{:?}", report.errors);
    assert!(all.contains("machine.kubelet.image"), "{all}");
    assert!(all.contains("set by layer machine"), "{all}");
    assert!(
        all.contains("Talos rule pkg/machinery/config/schemas/config.schema.json"),
        "{all}"
    );
    srv.finish().await;
}

/// The SMBIOS UUID binding is unconditional: a machine with none on record takes the first one it
/// presents with its own boot's token (recorded, an event), and any later fetch with another UUID
/// is refused and is an anomaly. (Before, a machine without a recorded UUID was served whatever
/// UUID a fetch carried.)
async fn a_machine_without_a_uuid_binds_the_first_one(b: Backend) {
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
    let text = std::fs::read_to_string(&inv).expect("inv");
    std::fs::write(&inv, text.replace(&format!("smbios_uuid: {UUID}\n"), "")).expect("write");
    apply_dir(&srv, &extra, &tmp.path().join("inv")).await;
    let m: Value = srv
        .req(Method::GET, "/api/v1/machines/node-1", &srv.viewer)
        .answer()
        .await
        .json();
    assert!(m["smbios_uuid"].is_null(), "{m}");
    let id = m["id"].as_str().expect("id").to_string();
    for state in ["ready"] {
        srv.req(
            Method::POST,
            &format!("/api/v1/machines/{id}/state"),
            &srv.operator,
        )
        .json(&json!({ "state": state }))
        .answer()
        .await
        .expect_status(StatusCode::OK);
    }
    srv.req(
        Method::POST,
        &format!("/api/v1/machines/{id}/provision"),
        &srv.operator,
    )
    .json(&json!({}))
    .answer()
    .await
    .expect_status(StatusCode::OK);
    let st: Value = srv
        .req(
            Method::GET,
            &format!("/api/v1/machines/{id}/config"),
            &srv.viewer,
        )
        .answer()
        .await
        .json();
    let schematic = st["schematic_id"].as_str().expect("schematic").to_string();
    let cache = plinth::images::ImageCache::new(srv.data_dir.join("images"));
    let k = tmp.path().join("k");
    std::fs::write(&k, b"kernel").expect("k");
    for name in ["kernel-amd64", "initramfs-amd64.xz"] {
        cache
            .import(&schematic, "v1.12.11", name, &k)
            .expect("import");
    }
    let first = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0";
    let token = token_of(&boot_script(&srv).await);
    assert_eq!(fetch(&srv, &id, &token, first).await.0, StatusCode::OK);
    let bound = events(&srv, &id, "config.uuid_bound").await;
    assert_eq!(bound.len(), 1);
    assert_eq!(bound[0]["detail"]["smbios_uuid"], first);
    let m: Value = srv
        .req(Method::GET, &format!("/api/v1/machines/{id}"), &srv.viewer)
        .answer()
        .await
        .json();
    assert_eq!(m["smbios_uuid"], first, "recorded in the inventory");
    // The next boot of the window presents another UUID: refused, an anomaly.
    let token = token_of(&boot_script(&srv).await);
    assert_eq!(
        fetch(&srv, &id, &token, UUID).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(events(&srv, &id, "config.uuid_mismatch").await.len(), 1);
    assert_eq!(fetch(&srv, &id, &token, first).await.0, StatusCode::OK);
    srv.finish().await;
}

both_backends!(
    config_delivery,
    a_machine_without_a_uuid_binds_the_first_one
);

/// A cluster given as base configs (as `talosctl gen config` writes them) instead of a secrets
/// bundle: its configs are rendered from those bases, secrets and all.
#[test]
fn base_configs_instead_of_a_bundle() {
    let tmp = tempfile::tempdir().expect("tmp");
    let secrets = tmp.path().join("bundle.yaml");
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().expect("plinth");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&[
        "cluster",
        "init",
        "lab",
        "--endpoint",
        "https://10.0.0.10:6443",
        "--out",
        secrets.to_str().expect("p"),
    ]);
    for role in ["controlplane", "worker"] {
        let base = run(&[
            "config",
            "generate",
            "--secrets",
            secrets.to_str().expect("p"),
            "--name",
            "lab",
            "--endpoint",
            "https://10.0.0.10:6443",
            "--talos-version",
            "v1.13.9",
            "--role",
            role,
        ]);
        std::fs::write(tmp.path().join(format!("{role}.yaml")), base).expect("write");
    }
    let inv = tmp.path().join("inv");
    std::fs::create_dir_all(&inv).expect("mkdir");
    std::fs::write(
        inv.join("all.yaml"),
        r#"kind: Cluster
name: lab
endpoint: https://10.0.0.10:6443
talosVersion: v1.13.9
baseConfigs:
  controlplane: ../controlplane.yaml
  worker: ../worker.yaml
---
kind: Profile
name: p
installDisk:
  type: ssd
---
kind: Machine
hostname: w1
role: worker
cluster: lab
profile: p
interfaces:
  - mac: "52:54:00:00:00:09"
    boot: true
disks:
  - serial: S1
    type: ssd
"#,
    )
    .expect("inventory");
    let config = tmp.path().join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[talos]\nschema_dir = \"{}\"\n",
            tmp.path().join("data").display(),
            schemas().display()
        ),
    )
    .expect("config");
    let cli = Cli { config };
    cli.ok(&["apply", inv.to_str().expect("p")]);
    let (yaml, _) = cli.ok(&["config", "render", "w1"]);
    let rendered = MachineConfig::parse(&yaml).expect("parses");
    let base = MachineConfig::parse(
        &std::fs::read_to_string(tmp.path().join("worker.yaml")).expect("base"),
    )
    .expect("base parses");
    let (r, b) = (
        rendered.v1alpha1().expect("doc"),
        base.v1alpha1().expect("doc"),
    );
    assert_eq!(r["machine"]["token"], b["machine"]["token"]);
    assert_eq!(r["cluster"]["ca"]["crt"], b["cluster"]["ca"]["crt"]);
    assert_eq!(r["machine"]["install"]["diskSelector"]["serial"], "S1");
}

/// The install script's kernel line is Image Factory's PXE line for the release, architecture and
/// the cluster's schematic, then the inventory's kernel arguments, then `talos.config=`. The
/// expected line is written out from Talos' source for v1.13.9 on amd64 (`pkg/imager/imager.go`
/// `buildCmdline`, `pkg/machinery/kernel/kernel.go` `DefaultArgs` and quirks, the metal
/// platform's console): a schematic `console=` replaces the platform's where it stands, `-pti`
/// removes Talos' `pti=on`, other arguments follow the defaults.
#[tokio::test]
async fn the_install_kernel_line_is_image_factorys_then_the_inventorys() {
    let srv = TestServer::start_with(Backend::Sqlite, "").await;
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
    let inv = tmp.path().join("inv");
    std::fs::create_dir_all(&inv).expect("mkdir");
    std::fs::write(
        inv.join("all.yaml"),
        format!(
            r#"kind: Cluster
name: lab
endpoint: https://10.88.0.10:6443
talosVersion: v1.13.9
secrets: {secrets}
schematic:
  customization:
    extraKernelArgs: ['console=ttyS0,115200', '-pti', plinth.schematic=1]
kernelArgs: [net.ifnames=0]
---
kind: Profile
name: vm
installDisk:
  type: ssd
kernelArgs: [intel_iommu=on]
---
kind: Machine
hostname: node-1
smbios_uuid: {UUID}
role: worker
cluster: lab
profile: vm
interfaces:
  - mac: "{MAC}"
    boot: true
disks:
  - serial: QM00001
    type: ssd
    size_bytes: 21474836480
"#,
            secrets = secrets.display()
        ),
    )
    .expect("inventory");
    apply_dir(&srv, "", &inv).await;
    let m: Value = srv
        .req(Method::GET, "/api/v1/machines/node-1", &srv.viewer)
        .answer()
        .await
        .json();
    let id = m["id"].as_str().expect("id").to_string();
    for (path, body) in [
        ("state", json!({"state": "ready"})),
        ("provision", json!({"ttl_seconds": 600})),
    ] {
        srv.req(
            Method::POST,
            &format!("/api/v1/machines/{id}/{path}"),
            &srv.operator,
        )
        .json(&body)
        .answer()
        .await
        .expect_status(StatusCode::OK);
    }
    let st: Value = srv
        .req(
            Method::GET,
            &format!("/api/v1/machines/{id}/config"),
            &srv.viewer,
        )
        .answer()
        .await
        .json();
    let schematic = st["schematic_id"].as_str().expect("schematic").to_string();
    let cache = plinth::images::ImageCache::new(srv.data_dir.join("images"));
    let k = tmp.path().join("k");
    std::fs::write(&k, b"kernel").expect("k");
    for name in ["kernel-amd64", "initramfs-amd64.xz"] {
        cache
            .import(&schematic, "v1.13.9", name, &k)
            .expect("import");
    }
    let script = boot_script(&srv).await;
    let line = script
        .lines()
        .find(|l| l.starts_with("kernel "))
        .unwrap_or_else(|| panic!("no kernel line: {script}"));
    let args = line
        .split_once(" initrd=initramfs-amd64.xz ")
        .map(|(_, rest)| rest)
        .and_then(|rest| rest.split_once(" talos.config="))
        .map(|(args, _)| args)
        .unwrap_or_else(|| panic!("kernel line: {line}"));
    assert_eq!(
        args,
        "talos.platform=metal console=ttyS0,115200 init_on_alloc=1 slab_nomerge consoleblank=0 \
         nvme_core.io_timeout=4294967295 printk.devkmsg=on selinux=1 module.sig_enforce=1 \
         proc_mem.force_override=never plinth.schematic=1 net.ifnames=0 intel_iommu=on"
    );
    assert!(line.ends_with(" || goto failed"), "{line}");
}

//! A real VM network-boots through Plinth: a network namespace with a bridge and a tap device,
//! Plinth on the bridge as the authoritative DHCP + TFTP + HTTP server, and qemu (TCG: KVM does not
//! work on these machines) booting with legacy BIOS and iPXE as the NIC ROM, or with UEFI (OVMF's
//! own PXE on virtio-net: TFTP ipxe.efi, then iPXE, then HTTP).
//!
//! - Discovery: the VM is unknown to Plinth, so it must end up registered as `discovered` with the
//!   SMBIOS UUID qemu gave it.
//! - Install: the VM is declared in an inventory directory (`plinth apply`), its provisioning
//!   window is opened through the API, and it boots the install plan: a kernel and initramfs from
//!   Plinth's image cache (Debian's kernel and a busybox initramfs standing in for Talos, see
//!   `support::vm_image`) whose init fetches `talos.config=` as Talos does and reports the body to
//!   a listener of the test. It passes only when that body is byte for byte what `plinth config
//!   render` prints and what the `config.served` event records, served to the VM's leased address.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plinth::domain::{LifecycleState, UniqueKey};
use plinth::service::{EventFilter, InventoryStore, LeaseState};
use sha2::{Digest, Sha256};

use crate::support::vm_image;

const BIN: &str = env!("CARGO_BIN_EXE_plinth");
/// The Talos version the test cluster targets (its schema is in ../shared/talos/schemas).
const TALOS: &str = "v1.11.6";
/// Where the VM's init reports what it fetched (busybox httpd in the namespace).
const REPORT_PORT: u16 = 8099;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One namespace with a bridge (Plinth's side) and a tap (the VM's cable); processes started in it
/// are killed by PID and the namespace deleted on drop.
struct Lab {
    ns: String,
    br: String,
    tap: String,
    children: Vec<Child>,
}

impl Lab {
    fn new(tag: &str) -> Lab {
        let n = std::process::id() % 100_000;
        let lab = Lab {
            ns: format!("plinth-vm{tag}{n}"),
            br: format!("plbr{tag}{n}"),
            tap: format!("pltap{tag}{n}"),
            children: vec![],
        };
        ip(&["netns", "add", &lab.ns]);
        ip(&["-n", &lab.ns, "link", "set", "lo", "up"]);
        ip(&["-n", &lab.ns, "link", "add", &lab.br, "type", "bridge"]);
        ip(&["-n", &lab.ns, "addr", "add", "10.88.0.1/24", "dev", &lab.br]);
        ip(&[
            "-n", &lab.ns, "tuntap", "add", "dev", &lab.tap, "mode", "tap",
        ]);
        ip(&["-n", &lab.ns, "link", "set", &lab.tap, "master", &lab.br]);
        ip(&["-n", &lab.ns, "link", "set", &lab.tap, "up"]);
        ip(&["-n", &lab.ns, "link", "set", &lab.br, "up"]);
        lab
    }

    fn spawn(&mut self, program: &str, args: &[String], log: &Path) -> usize {
        let f = std::fs::File::create(log).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, program])
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("dup"))
            .stderr(f)
            .spawn()
            .expect("spawn");
        self.children.push(child);
        self.children.len() - 1
    }

    /// Whether the process started as `idx` has exited.
    fn exited(&mut self, idx: usize) -> bool {
        matches!(self.children[idx].try_wait(), Ok(Some(_)))
    }

    /// Run a command in the namespace to completion (killed after `CLI_LIMIT_SECS`); its stdout,
    /// or a panic with its output.
    fn run(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns,
                "timeout",
                CLI_LIMIT_SECS,
                program,
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run in netns");
        assert!(
            out.status.success(),
            "{program} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// The test's working directory (config, database, logs, VM console); kept for a look afterwards
/// when `PLINTH_VM_KEEP` is set.
fn workdir(tag: &str) -> tempfile::TempDir {
    let keep = std::env::var_os("PLINTH_VM_KEEP").is_some();
    let dir = tempfile::Builder::new()
        .prefix(&format!("plinth-vm-{tag}-"))
        .disable_cleanup(keep)
        .tempdir()
        .expect("tmp");
    if keep {
        eprintln!("{tag}: working directory {}", dir.path().display());
    }
    dir
}

fn shared() -> PathBuf {
    std::env::var_os("PLINTH_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"))
}

fn config(dir: &Path, br: &str) -> PathBuf {
    let text = format!(
        r#"data_dir = "{data}"
[http]
listen = "10.88.0.1:8080"
[secrets]
key_file = "{key}"
[boot]
public_url = "http://10.88.0.1:8080"
ipxe_dir = "{ipxe}"
[talos]
schema_dir = "{schemas}"
[tftp]
enabled = true
[dhcp]
enabled = true
interfaces = ["{br}"]
[[dhcp.subnet]]
cidr = "10.88.0.0/24"
server_ip = "10.88.0.1"
pool = ["10.88.0.100-10.88.0.150"]
routers = ["10.88.0.1"]
lease_seconds = 600
"#,
        data = dir.join("data").display(),
        key = dir.join("secret.key").display(),
        ipxe = dir.join("ipxe").display(),
        schemas = shared().join("talos/schemas").display(),
    );
    // The iPXE binaries, from Debian's package, through the project's own script.
    let st = Command::new("sh")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("ipxe/fetch.sh"))
        .arg(dir.join("ipxe"))
        .stdout(Stdio::null())
        .status()
        .expect("fetch.sh");
    assert!(st.success(), "ipxe/fetch.sh");
    std::fs::write(
        dir.join("secret.key"),
        plinth::service::SecretBox::generate_key_text(),
    )
    .expect("key");
    let p = dir.join("plinth.toml");
    std::fs::write(&p, text).expect("config");
    p
}

fn wait_for_line(log: &Path, needle: &str, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(f) = std::fs::File::open(log) {
            if BufReader::new(f)
                .lines()
                .map_while(Result::ok)
                .any(|l| l.contains(needle))
            {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// The last `n` characters of a file (a VM console), for failure messages.
fn tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let skip = s.chars().count().saturating_sub(n);
    s.chars().skip(skip).collect()
}

/// How long one CLI command may take before `timeout` kills it.
const CLI_LIMIT_SECS: &str = "120";

/// Run the plinth CLI outside the namespace (commands that only touch the database and files).
fn plinth(args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .args([CLI_LIMIT_SECS, BIN])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("plinth")
}

fn plinth_ok(args: &[&str]) -> String {
    let out = plinth(args);
    assert!(
        out.status.success(),
        "plinth {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Start Plinth in the lab on `cfg`; its log file.
fn serve(lab: &mut Lab, dir: &Path, cfg: &Path) -> PathBuf {
    let plog = dir.join("plinth.log");
    lab.spawn(
        BIN,
        &["serve".into(), "--config".into(), cfg.display().to_string()],
        &plog,
    );
    assert!(
        wait_for_line(&plog, "serving HTTP on", Duration::from_secs(30)),
        "plinth did not start: {}",
        std::fs::read_to_string(&plog).unwrap_or_default()
    );
    plog
}

/// Start the VM; the index of its process in the lab.
fn start_vm(lab: &mut Lab, dir: &Path, uefi: bool, mac: &str, uuid: &str, mem_mb: u32) -> usize {
    let mut args: Vec<String> = [
        "-accel",
        "tcg",
        "-m",
        &mem_mb.to_string(),
        "-smp",
        "1",
        "-display",
        "none",
        "-vga",
        "none",
        "-no-reboot",
        "-uuid",
        uuid,
        "-smbios",
        "type=1,serial=VM-SERIAL-1,manufacturer=Plinth Test,product=NetBoot VM",
        "-netdev",
        &format!("tap,id=n0,ifname={},script=no,downscript=no", lab.tap),
        "-boot",
        "order=n",
        "-serial",
        &format!("file:{}", dir.join("serial.log").display()),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if uefi {
        let vars = dir.join("OVMF_VARS.fd");
        std::fs::copy("/usr/share/OVMF/OVMF_VARS.fd", &vars).expect("vars");
        args.extend([
            "-machine".to_string(),
            "q35".into(),
            "-drive".into(),
            "if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE.fd".into(),
            "-drive".into(),
            format!("if=pflash,format=raw,file={}", vars.display()),
            // No NIC ROM: OVMF's own virtio-net driver and PXE do the first stage.
            "-device".into(),
            format!("virtio-net-pci,netdev=n0,mac={mac},romfile="),
        ]);
    } else {
        // SeaBIOS with Debian's iPXE as the NIC's option ROM (ipxe-qemu).
        args.extend([
            "-device".to_string(),
            format!("virtio-net-pci,netdev=n0,mac={mac}"),
        ]);
    }
    if std::env::var_os("PLINTH_VM_KEEP").is_some() {
        // The VM's traffic too, for a look with tcpdump or Wireshark.
        args.extend([
            "-object".to_string(),
            format!(
                "filter-dump,id=f0,netdev=n0,file={}",
                dir.join("vm.pcap").display()
            ),
        ]);
    }
    let qlog = dir.join("qemu.log");
    lab.spawn("qemu-system-x86_64", &args, &qlog)
}

/// A reader of the server's SQLite database (WAL mode: beside the running server).
async fn open_store(dir: &Path) -> Arc<dyn InventoryStore> {
    let url = format!("sqlite://{}", dir.join("data/plinth.db").display());
    plinth::store::open(&plinth::store::StoreOptions {
        url,
        max_connections: 1,
        migrate: false,
    })
    .await
    .expect("store")
}

/// The firmware path the VM took, from Plinth's own log.
fn assert_firmware_path(log: &str, uefi: bool) {
    assert!(log.contains("dhcp answer"), "{log}");
    if uefi {
        assert!(
            log.contains("boot_file=\"ipxe.efi\""),
            "OVMF PXE got ipxe.efi: {log}"
        );
        assert!(log.contains("tftp read"), "ipxe.efi came over TFTP: {log}");
    }
    assert!(
        log.contains("boot_file=\"http://10.88.0.1:8080/boot.ipxe\""),
        "iPXE got the script URL: {log}"
    );
}

async fn boot_vm(tag: &str, uefi: bool) {
    let dir = workdir(tag);
    let mut lab = Lab::new(tag);
    let cfg = config(dir.path(), &lab.br);
    let plog = serve(&mut lab, dir.path(), &cfg);

    let mac = if uefi {
        "52:54:00:88:00:02"
    } else {
        "52:54:00:88:00:01"
    };
    let uuid = if uefi {
        "0b5d8d6e-6a52-4c1e-9e6f-5f1e2d3c4b02"
    } else {
        "0b5d8d6e-6a52-4c1e-9e6f-5f1e2d3c4b01"
    };
    start_vm(&mut lab, dir.path(), uefi, mac, uuid, 256);

    // Poll the inventory until the VM is discovered and its boot event written (the machine row
    // comes first: polling for it alone raced with the event).
    let store = open_store(dir.path()).await;
    let start = Instant::now();
    let mut found = None;
    while start.elapsed() < Duration::from_secs(360) {
        if let Some(m) = store
            .find_machine(&UniqueKey::Mac(mac.parse().expect("mac")))
            .await
            .expect("find")
        {
            let ev = store
                .list_events(&EventFilter {
                    machine_id: Some(m.id),
                    kind_prefix: Some("boot.".into()),
                    after_id: None,
                    limit: 10,
                })
                .await
                .expect("ev");
            if !ev.is_empty() {
                found = Some((m, ev));
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let log = std::fs::read_to_string(&plog).unwrap_or_default();
    let (m, ev) = found.unwrap_or_else(|| {
        panic!(
            "the VM never reached /boot/machine.ipxe in {:?}; plinth log:\n{log}\nVM console (tail):\n{}",
            start.elapsed(),
            tail(&dir.path().join("serial.log"), 3000)
        )
    });
    eprintln!("{tag}: VM discovered after {:?}", start.elapsed());
    assert_eq!(m.state, LifecycleState::Discovered);
    assert_eq!(m.smbios_uuid.map(|u| u.to_string()).as_deref(), Some(uuid));
    assert_eq!(m.serial.as_deref(), Some("VM-SERIAL-1"));
    assert_eq!(m.manufacturer.as_deref(), Some("Plinth Test"));
    assert_eq!(m.model.as_deref(), Some("NetBoot VM"));
    assert_eq!(ev[0].kind, "boot.discovered");
    assert_eq!(
        ev[0].detail["platform"],
        if uefi { "efi" } else { "pcbios" }
    );
    assert_firmware_path(&log, uefi);
}

/// The declarative inventory of the install test: one cluster (secrets outside the directory),
/// one profile with install-disk rules, and the VM.
fn write_inventory(dir: &Path, host: &str, mac: &str, uuid: &str) -> PathBuf {
    let secrets = dir.join("secrets/vmlab.yaml");
    std::fs::create_dir_all(secrets.parent().expect("parent")).expect("secrets dir");
    plinth_ok(&[
        "cluster",
        "init",
        "vmlab",
        "--endpoint",
        "https://10.88.0.10:6443",
        "--out",
        &secrets.display().to_string(),
    ]);
    let inv = dir.join("inventory");
    for d in ["clusters", "profiles", "machines"] {
        std::fs::create_dir_all(inv.join(d)).expect("inventory dir");
    }
    // No `schematic`: the vanilla schematic, which `plinth image import` also defaults to.
    std::fs::write(
        inv.join("clusters/vmlab.yaml"),
        format!(
            "kind: Cluster\nname: vmlab\nendpoint: https://10.88.0.10:6443\ntalosVersion: {TALOS}\n\
             secrets: {}\n\
             # The stand-in's console: the serial port (the test's VM console log).\n\
             kernelArgs:\n  - console=ttyS0\n  - panic=-1\n",
            secrets.display()
        ),
    )
    .expect("cluster");
    std::fs::write(
        inv.join("profiles/qemu.yaml"),
        "kind: Profile\nname: qemu\n\
         installDisk:\n  type: ssd\n  size: [\">= 8GB\", \"<= 64GB\"]\n  prefer: smallest\n",
    )
    .expect("profile");
    std::fs::write(
        inv.join(format!("machines/{host}.yaml")),
        format!(
            "kind: Machine\nhostname: {host}\nsmbios_uuid: {uuid}\nrole: worker\ncluster: vmlab\nprofile: qemu\n\
             interfaces:\n  - mac: \"{mac}\"\n    boot: true\n\
             # The install disk by the profile's rules (16 GiB SSD), and a data disk.\n\
             disks:\n  - serial: QM00001\n    model: QEMU HARDDISK\n    size_bytes: 17179869184\n    type: ssd\n\
             \x20 - serial: QM00002\n    model: QEMU HARDDISK\n    size_bytes: 107374182400\n    type: hdd\n"
        ),
    )
    .expect("machine");
    inv
}

/// What the VM's init reported: the query string's fields and the POSTed body.
struct Report {
    fields: HashMap<String, String>,
    body: Vec<u8>,
}

/// busybox httpd in the namespace with one CGI script that keeps what the VM POSTs.
fn start_report_listener(lab: &mut Lab, dir: &Path) -> PathBuf {
    let www = dir.join("report-www");
    let out = dir.join("report");
    std::fs::create_dir_all(www.join("cgi-bin")).expect("www");
    std::fs::create_dir_all(&out).expect("report dir");
    let script = www.join("cgi-bin/report");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             head -c \"${{CONTENT_LENGTH:-0}}\" > '{out}/body.part' && mv '{out}/body.part' '{out}/body'\n\
             printf '%s' \"$QUERY_STRING\" > '{out}/fields.part' && mv '{out}/fields.part' '{out}/fields'\n\
             printf 'Content-Type: text/plain\\r\\n\\r\\nok\\n'\n",
            out = out.display()
        ),
    )
    .expect("cgi");
    let st = Command::new("chmod")
        .args(["755"])
        .arg(&script)
        .status()
        .expect("chmod");
    assert!(st.success());
    lab.spawn(
        "busybox",
        &[
            "httpd".into(),
            "-f".into(),
            "-p".into(),
            format!("10.88.0.1:{REPORT_PORT}"),
            "-h".into(),
            www.display().to_string(),
        ],
        &dir.join("report-httpd.log"),
    );
    out
}

fn read_report(out: &Path) -> Option<Report> {
    let fields = std::fs::read_to_string(out.join("fields")).ok()?;
    let body = std::fs::read(out.join("body")).ok()?;
    let fields = fields
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Some(Report { fields, body })
}

async fn install_vm(tag: &str, uefi: bool) {
    let dir = workdir(tag);
    let d = dir.path();
    let mut lab = Lab::new(tag);
    let cfg = config(d, &lab.br);
    let cfg_s = cfg.display().to_string();
    let (host, mac, uuid) = if uefi {
        (
            "vm-uefi",
            "52:54:00:88:01:02",
            "6c1f3a2e-58d4-4b7e-a0c9-2e7d1b4f9a12",
        )
    } else {
        (
            "vm-bios",
            "52:54:00:88:01:01",
            "6c1f3a2e-58d4-4b7e-a0c9-2e7d1b4f9a11",
        )
    };

    // The image: Debian's kernel and a busybox initramfs, imported as Talos would be.
    let report_url = format!("http://10.88.0.1:{REPORT_PORT}/cgi-bin/report");
    let image = vm_image::build(d, &report_url);
    eprintln!(
        "{tag}: stand-in image: kernel {}, initramfs of {} bytes",
        image.kernel_release,
        std::fs::metadata(&image.initramfs).map_or(0, |m| m.len())
    );
    plinth_ok(&[
        "image",
        "import",
        "--config",
        &cfg_s,
        "--version",
        TALOS,
        "--arch",
        "amd64",
        "--kernel",
        &image.kernel.display().to_string(),
        "--initramfs",
        &image.initramfs.display().to_string(),
    ]);

    // The VM, declared; the same config file (database, secret key) as the server.
    let inv = write_inventory(d, host, mac, uuid);
    plinth_ok(&["apply", &inv.display().to_string(), "--config", &cfg_s]);
    let token = plinth_ok(&["token", "create", "--role", "operator", "--config", &cfg_s])
        .trim()
        .to_string();

    let plog = serve(&mut lab, d, &cfg);
    let report_dir = start_report_listener(&mut lab, d);

    // Through the API: accept the machine and open its provisioning window.
    let server = "http://10.88.0.1:8080";
    for args in [
        vec!["machine", "state", host, "ready"],
        vec!["machine", "provision", host, "--ttl", "3600"],
    ] {
        let mut a = args.clone();
        a.extend(["--server", server, "--token", &token]);
        lab.run(BIN, &a);
    }

    let qemu = start_vm(&mut lab, d, uefi, mac, uuid, 512);
    let start = Instant::now();
    let limit = Duration::from_secs(600);
    let report = loop {
        if let Some(r) = read_report(&report_dir) {
            break Some(r);
        }
        // A boot that Plinth holds (no image, no config) polls forever: fail now, with the reason.
        let held = std::fs::read_to_string(&plog).is_ok_and(|l| l.contains("plan=\"hold\""));
        if held || start.elapsed() > limit || lab.exited(qemu) {
            // One last look: the report may have landed just before qemu powered off.
            break read_report(&report_dir);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let fetched_after = start.elapsed();
    let serial = d.join("serial.log");
    let log = std::fs::read_to_string(&plog).unwrap_or_default();
    let report = report.unwrap_or_else(|| {
        panic!(
            "the VM reported no config in {fetched_after:?} (qemu exited: {}, Plinth held the boot: {}); plinth log:\n{log}\nVM console (tail):\n{}\nqemu:\n{}",
            lab.exited(qemu),
            log.contains("plan=\"hold\""),
            tail(&serial, 6000),
            std::fs::read_to_string(d.join("qemu.log")).unwrap_or_default()
        )
    });
    eprintln!(
        "{tag}: the VM fetched its config after {fetched_after:?} ({:?})",
        report.fields
    );
    assert_eq!(
        report.fields.get("status").map(String::as_str),
        Some("ok"),
        "the VM's fetch failed: {}\nplinth log:\n{log}\nVM console (tail):\n{}",
        String::from_utf8_lossy(&report.body),
        tail(&serial, 3000)
    );
    // The init powers the VM off after reporting.
    let off = Instant::now();
    while !lab.exited(qemu) && off.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(lab.exited(qemu), "the VM did not power off after reporting");
    eprintln!("{tag}: VM powered off after {:?}", start.elapsed());

    // What the VM got is what Plinth renders for it, and what the served event records.
    let body_sha = hex::encode(Sha256::digest(&report.body));
    assert_eq!(
        report.fields.get("sha256"),
        Some(&body_sha),
        "sha256 in the VM"
    );
    assert_eq!(
        report.fields.get("len"),
        Some(&report.body.len().to_string())
    );
    assert_eq!(report.fields.get("uuid").map(String::as_str), Some(uuid));
    let render = plinth(&["config", "render", host, "--config", &cfg_s]);
    assert!(
        render.status.success(),
        "{}",
        String::from_utf8_lossy(&render.stderr)
    );
    assert!(
        report.body == render.stdout,
        "the VM fetched a config that differs from `plinth config render {host}`:\n{}",
        plinth::service::config::config_diff(
            std::str::from_utf8(&render.stdout).ok(),
            std::str::from_utf8(&report.body).ok(),
            host
        )
    );
    let yaml = String::from_utf8(report.body.clone()).expect("utf-8 config");
    assert!(yaml.contains(&format!("hostname: {host}")), "{yaml}");

    let store = open_store(d).await;
    let m = store
        .find_machine(&UniqueKey::Mac(mac.parse().expect("mac")))
        .await
        .expect("find")
        .expect("the declared machine");
    assert_eq!(m.smbios_uuid.map(|u| u.to_string()).as_deref(), Some(uuid));
    let events = store
        .list_events(&EventFilter {
            machine_id: Some(m.id),
            kind_prefix: None,
            after_id: None,
            limit: 200,
        })
        .await
        .expect("events");
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let served: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "config.served")
        .collect();
    assert_eq!(served.len(), 1, "one config.served: {kinds:?}");
    assert!(
        !kinds.contains(&"config.refused"),
        "no refused fetch: {:?}",
        events
            .iter()
            .filter(|e| e.kind == "config.refused")
            .map(|e| &e.detail)
            .collect::<Vec<_>>()
    );
    assert_eq!(served[0].detail["sha256"], body_sha.as_str());
    assert_eq!(served[0].detail["talos_version"], TALOS);
    let install = events
        .iter()
        .find(|e| e.kind == "boot.script" && e.detail["plan"] == "install")
        .unwrap_or_else(|| panic!("an install boot script was served: {kinds:?}"));
    assert_eq!(
        install.detail["platform"],
        if uefi { "efi" } else { "pcbios" }
    );
    // Served to the VM's leased address (Plinth leased it; nothing is reserved for the machine).
    let from: std::net::Ipv4Addr = served[0].detail["from"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("config.served from: {}", served[0].detail));
    let leases = store
        .leases_of_mac(mac.parse().expect("mac"))
        .await
        .expect("leases");
    assert!(
        leases
            .iter()
            .any(|l| l.ip == from && l.state == LeaseState::Bound),
        "config served to {from}, not a bound lease of {mac}: {leases:?}"
    );
    assert_eq!(
        report.fields.get("ip"),
        Some(&from.to_string()),
        "the address the VM leased"
    );
    assert!(m.interfaces.iter().all(|i| i.ipv4.is_none()));
    assert_firmware_path(&log, uefi);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bios_vm_with_ipxe_rom_is_discovered() {
    boot_vm("b", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uefi_vm_with_ovmf_pxe_is_discovered() {
    boot_vm("u", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bios_vm_installs_and_fetches_its_rendered_config() {
    install_vm("bi", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uefi_vm_installs_and_fetches_its_rendered_config() {
    install_vm("ui", true).await;
}

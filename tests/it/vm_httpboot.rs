//! Real UEFI firmware boots through Plinth by UEFI HTTP boot only: OVMF (x86-64) and AAVMF
//! (ARM64) in qemu (TCG) on the lab's bridge, their PXE and IPv6 stack switched off through the
//! firmware's own fw_cfg switches so that the one network boot option left is "UEFI HTTPv4"
//! (`vm_lab::http_boot_only_args`), and Plinth's TFTP server off, so nothing can fall back to it.
//! The firmware asks DHCP with option 60 `HTTPClient` and option 93 16 (x86-64) or 19 (ARM64),
//! gets the URL of Plinth's `/ipxe/ipxe.efi` (or `ipxe-arm64.efi`) with `HTTPClient` echoed,
//! downloads it over HTTP (`HEAD` for the length, then `GET`), and iPXE takes over: the boot
//! script, the install (kernel and initramfs over HTTP) and the config fetch, as in `vm_boot`.
//!
//! - `x86_http_boot_installs_with_plinth_authoritative`: Plinth owns the addresses.
//! - `x86_http_boot_installs_beside_dnsmasq_as_proxy_dhcp`: dnsmasq owns the addresses, on a
//!   namespace of its own cabled to the lab's bridge; Plinth answers in proxy mode (boot
//!   information, no address) and records no lease; the config goes to dnsmasq's address.
//! - `arm64_http_boot_is_discovered`: AAVMF boots Debian's ARM64 iPXE by HTTP and registers.
//!
//! Needs root (namespaces), qemu-system-x86, qemu-system-arm, ovmf, qemu-efi-aarch64, ipxe,
//! dnsmasq, linux-image-amd64, busybox-static. Every wait is bounded; every process is killed by
//! PID and each namespace deleted on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use plinth::domain::{LifecycleState, UniqueKey};
use plinth::service::{Event, EventFilter, LeaseState};
use sha2::{Digest, Sha256};

use crate::support::vm_image;
use crate::support::vm_lab::{
    config, http_boot_only_args, import_image, ip, open_store, plinth, plinth_ok, qemu_command,
    read_report, serve, start_report_listener, tail, wait_for_line, without_tftp, workdir,
    write_inventory, InventoryExtras, Lab, VmSpec, REPORT_PORT,
};

/// What the firmware prints when it takes the HTTP boot option (EDK2's HttpBootDxe).
const HTTP_BOOT_BANNER: &str = ">>Start HTTP Boot over IPv4";
/// What it prints when it takes a PXE option instead (UefiPxeBcDxe).
const PXE_BANNER: &str = ">>Start PXE over IPv4";

/// dnsmasq as the site's DHCP server, in a namespace of its own whose veth is a port of the
/// lab's bridge (10.88.0.2). Killed by PID and its namespace deleted on drop (before the lab's).
struct Dnsmasq {
    ns: String,
    child: Child,
    leases: PathBuf,
}

impl Dnsmasq {
    fn start(lab: &Lab, tag: &str, dir: &Path) -> Dnsmasq {
        let n = std::process::id() % 100_000;
        let ns = format!("plinth-vmdq{tag}{n}");
        let (near, far) = (format!("pldq{tag}{n}"), format!("pldqp{tag}{n}"));
        ip(&["netns", "add", &ns]);
        ip(&[
            "-n", &lab.ns, "link", "add", &near, "type", "veth", "peer", "name", &far, "netns", &ns,
        ]);
        ip(&["-n", &lab.ns, "link", "set", &near, "master", &lab.br]);
        ip(&["-n", &lab.ns, "link", "set", &near, "up"]);
        ip(&["-n", &ns, "addr", "add", "10.88.0.2/24", "dev", &far]);
        ip(&["-n", &ns, "link", "set", &far, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        let leases = dir.join("dnsmasq.leases");
        let log = dir.join("dnsmasq.log");
        let f = std::fs::File::create(&log).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, "dnsmasq"])
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--port=0",
                "--user=root",
                "--bind-interfaces",
                &format!("--interface={far}"),
                "--dhcp-range=10.88.0.160,10.88.0.190,255.255.255.0,600",
                "--dhcp-authoritative",
                "--log-dhcp",
                &format!("--dhcp-leasefile={}", leases.display()),
            ])
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("dup"))
            .stderr(f)
            .spawn()
            .expect("dnsmasq");
        let peer = Dnsmasq { ns, child, leases };
        assert!(
            wait_for_line(&log, "DHCP, sockets bound", Duration::from_secs(15)),
            "dnsmasq did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        peer
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// `cfg` with the lab's subnet served in proxy mode (no pool: dnsmasq owns the addresses).
fn proxy_mode(cfg: &Path) {
    let text = std::fs::read_to_string(cfg).expect("config");
    let owned =
        "pool = [\"10.88.0.100-10.88.0.150\"]\nrouters = [\"10.88.0.1\"]\nlease_seconds = 600\n";
    assert!(text.contains(owned), "{text}");
    std::fs::write(cfg, text.replacen(owned, "mode = \"proxy\"\n", 1)).expect("config");
}

/// Start the VM with HTTP boot as its only network boot; the index of its process in the lab.
fn start_http_vm(
    lab: &mut Lab,
    dir: &Path,
    arm64: bool,
    mac: &str,
    uuid: &str,
    mem_mb: u32,
) -> usize {
    let serial = dir.join("serial.log");
    let mut cmd = qemu_command(
        lab,
        &VmSpec {
            uefi: true,
            arm64,
            mac,
            uuid,
            mem_mb,
            serial: &serial,
            disk: None,
            dir,
        },
    );
    cmd.extend(http_boot_only_args());
    cmd.extend(["-boot".to_string(), "order=n".into()]);
    lab.spawn(&cmd[0], &cmd[1..], &dir.join("qemu.log"))
}

/// The firmware took UEFI HTTP boot, never PXE, and fetched `file` from Plinth by URL; Plinth
/// answered it as an HTTP boot client, ran no TFTP server and sent no TFTP file.
fn assert_http_boot_path(log: &str, console: &str, file: &str, arch: &str) {
    let url = format!("http://10.88.0.1:8080/ipxe/{file}");
    assert!(
        console.contains(HTTP_BOOT_BANNER) && console.contains(&format!("URI: {url}")),
        "the firmware's HTTP boot fetched {url}; console:\n{console}"
    );
    assert!(!console.contains(PXE_BANNER), "no PXE attempt: {console}");
    assert!(log.contains("TFTP off"), "{log}");
    assert!(
        log.contains(&format!("client=uefi-http-{arch} boot_file=\"{url}\"")),
        "Plinth answered the firmware as an HTTP boot client: {log}"
    );
    assert!(
        log.contains(&format!("file={file}")) && log.contains("ipxe binary served over HTTP"),
        "{file} went out over HTTP: {log}"
    );
    assert!(!log.contains("tftp read"), "{log}");
    assert!(
        log.contains("boot_file=\"http://10.88.0.1:8080/boot.ipxe\""),
        "iPXE got the script URL: {log}"
    );
}

async fn events_of(store: &plinth::service::Stores, id: plinth::domain::MachineId) -> Vec<Event> {
    store
        .events
        .list_events(&EventFilter {
            machine_id: Some(id),
            kind_prefix: None,
            after_id: None,
            limit: 500,
        })
        .await
        .expect("events")
}

/// HTTP boot of x86-64 OVMF to the install and the config fetch; `proxy`: beside dnsmasq.
async fn http_install(tag: &str, proxy: bool) {
    let dir = workdir(tag);
    let d = dir.path();
    let mut lab = Lab::new(tag);
    let cfg = config(d, &lab.br, "");
    without_tftp(&cfg);
    if proxy {
        proxy_mode(&cfg);
    }
    let cfg_s = cfg.display().to_string();
    let (host, mac, uuid) = if proxy {
        (
            "vm-http-proxy",
            "52:54:00:88:05:02",
            "5a0c9e1d-2b7f-4c3a-9d8e-1f2a3b4c5d02",
        )
    } else {
        (
            "vm-http",
            "52:54:00:88:05:01",
            "5a0c9e1d-2b7f-4c3a-9d8e-1f2a3b4c5d01",
        )
    };
    let report_url = format!("http://10.88.0.1:{REPORT_PORT}/cgi-bin/report");
    let image = vm_image::build(d, &report_url);
    import_image(&cfg, &image);
    let inv = write_inventory(d, host, mac, uuid, &InventoryExtras::default());
    plinth_ok(&["apply", &inv.display().to_string(), "--config", &cfg_s]);
    let token = plinth_ok(&["token", "create", "--role", "operator", "--config", &cfg_s])
        .trim()
        .to_string();

    let dnsmasq = proxy.then(|| Dnsmasq::start(&lab, tag, d));
    let plog = serve(&mut lab, d, &cfg);
    let report_dir = start_report_listener(&mut lab, d);
    lab.cli(&token, &["machine", "state", host, "ready"]);
    lab.cli(&token, &["machine", "provision", host, "--ttl", "3600"]);

    let qemu = start_http_vm(&mut lab, d, false, mac, uuid, 512);
    let start = Instant::now();
    let limit = Duration::from_secs(600);
    let report = loop {
        if let Some(r) = read_report(&report_dir) {
            break Some(r);
        }
        let held = std::fs::read_to_string(&plog).is_ok_and(|l| l.contains("plan=\"hold\""));
        if held || start.elapsed() > limit || lab.exited(qemu) {
            break read_report(&report_dir);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let serial = d.join("serial.log");
    let log = std::fs::read_to_string(&plog).unwrap_or_default();
    let console = String::from_utf8_lossy(&std::fs::read(&serial).unwrap_or_default()).into_owned();
    let report = report.unwrap_or_else(|| {
        panic!(
            "the VM reported no config in {:?} (qemu exited: {}); plinth log:\n{log}\nVM console (tail):\n{}\nqemu:\n{}\ndnsmasq:\n{}",
            start.elapsed(),
            lab.exited(qemu),
            tail(&serial, 6000),
            std::fs::read_to_string(d.join("qemu.log")).unwrap_or_default(),
            tail(&d.join("dnsmasq.log"), 3000),
        )
    });
    eprintln!(
        "{tag}: the VM fetched its config after {:?} ({:?})",
        start.elapsed(),
        report.fields
    );
    assert_eq!(
        report.fields.get("status").map(String::as_str),
        Some("ok"),
        "the VM's fetch failed: {}\nplinth log:\n{log}\nVM console (tail):\n{}",
        String::from_utf8_lossy(&report.body),
        tail(&serial, 3000)
    );
    assert_http_boot_path(&log, &console, "ipxe.efi", "Amd64");

    // What the VM got is what Plinth renders for it.
    let render = plinth(&["config", "render", host, "--config", &cfg_s]);
    assert!(
        render.status.success(),
        "{}",
        String::from_utf8_lossy(&render.stderr)
    );
    assert!(
        report.body == render.stdout,
        "the VM's config differs from `plinth config render`"
    );
    assert_eq!(report.fields.get("uuid").map(String::as_str), Some(uuid));
    let vm_ip: std::net::Ipv4Addr = report
        .fields
        .get("ip")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the VM's address: {:?}", report.fields));

    let store = open_store(d).await;
    let m = store
        .machines
        .find_machine(&UniqueKey::Mac(mac.parse().expect("mac")))
        .await
        .expect("find")
        .expect("the declared machine");
    let events = events_of(&store, m.id).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let served: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind == "config.served")
        .collect();
    assert_eq!(served.len(), 1, "one config.served: {kinds:?}");
    assert_eq!(
        served[0].detail["sha256"],
        hex::encode(Sha256::digest(&report.body)).as_str()
    );
    assert_eq!(served[0].detail["from"], vm_ip.to_string().as_str());
    assert!(!kinds.contains(&"config.refused"), "{kinds:?}");
    assert!(
        !kinds.iter().any(|k| k.starts_with("tftp.")),
        "no TFTP step at all: {kinds:?}"
    );
    let install = events
        .iter()
        .find(|e| e.kind == "boot.script" && e.detail["plan"] == "install")
        .unwrap_or_else(|| panic!("an install boot script: {kinds:?}"));
    assert_eq!(install.detail["platform"], "efi");
    assert!(
        log.lines()
            .any(|l| l.contains("ipxe binary served over HTTP")
                && l.contains(&format!("from={vm_ip}"))),
        "ipxe.efi went to the VM's address {vm_ip}: {log}"
    );

    let leases = store
        .leases
        .leases_of_mac(mac.parse().expect("mac"))
        .await
        .expect("leases");
    if let Some(dq) = &dnsmasq {
        // The address is dnsmasq's: Plinth only added the boot file (a proxy offer, no address)
        // and holds no lease for the VM.
        assert!(
            log.contains(&format!(
                "mac={mac} kind=offer yiaddr=0.0.0.0 client=uefi-http-Amd64"
            )),
            "a proxy offer to the firmware: {log}"
        );
        assert!(
            leases.is_empty(),
            "Plinth leased nothing in proxy mode: {leases:?}"
        );
        let dq_leases = std::fs::read_to_string(&dq.leases).unwrap_or_default();
        assert!(
            dq_leases.contains(&format!("{mac} {vm_ip}")),
            "dnsmasq leased {vm_ip} to {mac}: {dq_leases}"
        );
    } else {
        // Plinth's own lease; the timeline shows each step in order: the firmware's DHCP, its
        // HTTP download of iPXE, the install script, the image, the config.
        assert!(
            leases
                .iter()
                .any(|l| l.ip == vm_ip && l.state == LeaseState::Bound),
            "{vm_ip} is a bound lease of {mac}: {leases:?}"
        );
        let pos = |k: &str, file: Option<&str>| {
            events
                .iter()
                .position(|e| e.kind == k && file.is_none_or(|f| e.detail["file"] == f))
                .unwrap_or_else(|| panic!("{k} {file:?} in the timeline: {kinds:?}"))
        };
        let ipxe = pos("http.ipxe", Some("ipxe.efi"));
        assert!(pos("dhcp.ack", None) < ipxe, "{kinds:?}");
        assert_eq!(events[ipxe].detail["ip"], vm_ip.to_string().as_str());
        assert_eq!(
            events[ipxe].detail["bytes"].as_u64(),
            std::fs::metadata(d.join("ipxe/ipxe.efi"))
                .ok()
                .map(|m| m.len())
        );
        let script = events
            .iter()
            .position(|e| e.kind == "boot.script" && e.detail["plan"] == "install")
            .expect("install script");
        assert!(ipxe < script, "{kinds:?}");
        assert!(
            script < pos("http.image", Some("kernel-amd64")),
            "{kinds:?}"
        );
        assert!(
            pos("http.image", Some("initramfs-amd64.xz")) < pos("config.served", None),
            "{kinds:?}"
        );
    }
    drop(lab);
    drop(dnsmasq);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x86_http_boot_installs_with_plinth_authoritative() {
    http_install("ha", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x86_http_boot_installs_beside_dnsmasq_as_proxy_dhcp() {
    http_install("hp", true).await;
}

/// AAVMF asks with option 93 = 19, gets the URL of `ipxe-arm64.efi`, and Debian's ARM64 iPXE
/// (from a newer suite's package: Debian 12's has none) chains to the script, which registers
/// the unknown machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arm64_http_boot_is_discovered() {
    let tag = "hr";
    let dir = workdir(tag);
    let d = dir.path();
    let mut lab = Lab::new(tag);
    let cfg = config(d, &lab.br, "");
    without_tftp(&cfg);
    std::fs::copy(
        vm_image::debian_ipxe_dir().join("ipxe-arm64.efi"),
        d.join("ipxe/ipxe-arm64.efi"),
    )
    .expect("ipxe-arm64.efi");
    let plog = serve(&mut lab, d, &cfg);
    let (mac, uuid) = ("52:54:00:88:05:03", "5a0c9e1d-2b7f-4c3a-9d8e-1f2a3b4c5d03");
    start_http_vm(&mut lab, d, true, mac, uuid, 256);

    let store = open_store(d).await;
    let start = Instant::now();
    let mut found = None;
    while start.elapsed() < Duration::from_secs(420) {
        if let Some(m) = store
            .machines
            .find_machine(&UniqueKey::Mac(mac.parse().expect("mac")))
            .await
            .expect("find")
        {
            let ev = events_of(&store, m.id).await;
            if ev.iter().any(|e| e.kind == "boot.discovered") {
                found = Some((m, ev));
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let log = std::fs::read_to_string(&plog).unwrap_or_default();
    let serial = d.join("serial.log");
    let (m, ev) = found.unwrap_or_else(|| {
        panic!(
            "the VM was not discovered in {:?}; plinth log:\n{log}\nVM console (tail):\n{}",
            start.elapsed(),
            tail(&serial, 4000)
        )
    });
    eprintln!("{tag}: VM discovered after {:?}", start.elapsed());
    assert_eq!(m.state, LifecycleState::Discovered);
    assert_eq!(m.smbios_uuid.map(|u| u.to_string()).as_deref(), Some(uuid));
    let disc = ev
        .iter()
        .find(|e| e.kind == "boot.discovered")
        .expect("discovered");
    assert_eq!(disc.detail["platform"], "efi");
    assert_eq!(disc.detail["buildarch"], "arm64", "{}", disc.detail);
    let console = String::from_utf8_lossy(&std::fs::read(&serial).unwrap_or_default()).into_owned();
    assert_http_boot_path(&log, &console, "ipxe-arm64.efi", "Arm64");
}

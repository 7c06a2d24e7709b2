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
//!   render` prints and what the `config.served` event records, served to the VM's leased address,
//!   and when the kernel line the VM's kernel got (its `/proc/cmdline`, printed by the init to the
//!   serial console) is Image Factory's PXE line for Talos 1.11.6 and the cluster's schematic
//!   (Talos' defaults, then the schematic's `extraKernelArgs`), then the inventory's `kernelArgs`.

use std::path::Path;
use std::time::{Duration, Instant};

use plinth::domain::{LifecycleState, UniqueKey};
use plinth::service::{EventFilter, LeaseState};
use sha2::{Digest, Sha256};

use crate::support::vm_image;
use crate::support::vm_lab::{
    config, import_image_as, open_store, plinth, plinth_ok, qemu_command, read_report, serve,
    start_report_listener, tail, workdir, write_inventory, InventoryExtras, Lab, VmSpec,
    REPORT_PORT, TALOS,
};

/// The image door's port in the lab (the install VM that fetches its image through it).
const IMAGE_DOOR_PORT: u16 = 8081;

/// The install VMs' cluster schematic: two extra kernel arguments, one of which removes a Talos
/// default (`-consoleblank`, as Image Factory's imager treats a negated argument).
const SCHEMATIC: &str =
    "customization:\n  extraKernelArgs:\n    - plinth.schematic=yes\n    - -consoleblank\n";

/// The kernel line an install VM must get, up to `talos.config=`: `initrd=` (iPXE), then Image
/// Factory's PXE line for Talos v1.11.6 on amd64 and [`SCHEMATIC`] (`talos.platform=metal`, the
/// metal console, Talos 1.11's `DefaultArgs` without `consoleblank=0`, the schematic's argument),
/// then the cluster's `kernelArgs`. Written out from Talos' source (`pkg/imager/imager.go`,
/// `pkg/machinery/kernel/kernel.go`, the metal platform), not computed by Plinth's code.
const EXPECTED_CMDLINE: &str = "initrd=initramfs-amd64.xz talos.platform=metal console=tty0 \
     init_on_alloc=1 slab_nomerge pti=on nvme_core.io_timeout=4294967295 printk.devkmsg=on \
     selinux=1 plinth.schematic=yes console=ttyS0 panic=-1 talos.config=";

/// The firmware a VM boots with.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fw {
    /// SeaBIOS with iPXE as the NIC ROM.
    Bios,
    /// x86-64 OVMF, its own PXE.
    Uefi,
    /// ARM64 AAVMF, its own PXE.
    Arm64,
}

/// Start the VM (network first); the index of its process in the lab.
fn start_vm(lab: &mut Lab, dir: &Path, fw: Fw, mac: &str, uuid: &str, mem_mb: u32) -> usize {
    let serial = dir.join("serial.log");
    let mut cmd = qemu_command(
        lab,
        &VmSpec {
            uefi: fw != Fw::Bios,
            arm64: fw == Fw::Arm64,
            mac,
            uuid,
            mem_mb,
            serial: &serial,
            disk: None,
            dir,
        },
    );
    cmd.extend(["-boot".to_string(), "order=n".into()]);
    let qlog = dir.join("qemu.log");
    lab.spawn(&cmd[0], &cmd[1..], &qlog)
}

/// The firmware path the VM took, from Plinth's own log.
fn assert_firmware_path(log: &str, fw: Fw) {
    assert!(log.contains("dhcp answer"), "{log}");
    let first = match fw {
        Fw::Bios => None,
        Fw::Uefi => Some("ipxe.efi"),
        Fw::Arm64 => Some("ipxe-arm64.efi"),
    };
    if let Some(file) = first {
        assert!(
            log.contains(&format!("boot_file=\"{file}\"")),
            "the firmware's PXE got {file}: {log}"
        );
        assert!(
            log.contains(&format!("file={file}")),
            "{file} came over TFTP: {log}"
        );
    }
    assert!(
        log.contains("boot_file=\"http://10.88.0.1:8080/boot.ipxe\""),
        "iPXE got the script URL: {log}"
    );
}

async fn boot_vm(tag: &str, fw: Fw) {
    let dir = workdir(tag);
    let mut lab = Lab::new(tag);
    let cfg = config(dir.path(), &lab.br, "");
    if fw == Fw::Arm64 {
        // Debian 12's ipxe package has no ARM64 binary; later Debian suites' package has.
        let arm = vm_image::debian_ipxe_dir();
        std::fs::copy(
            arm.join("ipxe-arm64.efi"),
            dir.path().join("ipxe/ipxe-arm64.efi"),
        )
        .expect("ipxe-arm64.efi");
    }
    let plog = serve(&mut lab, dir.path(), &cfg);

    let (mac, uuid) = match fw {
        Fw::Bios => ("52:54:00:88:00:01", "0b5d8d6e-6a52-4c1e-9e6f-5f1e2d3c4b01"),
        Fw::Uefi => ("52:54:00:88:00:02", "0b5d8d6e-6a52-4c1e-9e6f-5f1e2d3c4b02"),
        Fw::Arm64 => ("52:54:00:88:00:03", "0b5d8d6e-6a52-4c1e-9e6f-5f1e2d3c4b03"),
    };
    start_vm(&mut lab, dir.path(), fw, mac, uuid, 256);

    // Poll the inventory until the VM is discovered and its boot event written (the machine row
    // comes first: polling for it alone raced with the event).
    let store = open_store(dir.path()).await;
    let start = Instant::now();
    let mut found = None;
    while start.elapsed() < Duration::from_secs(360) {
        if let Some(m) = store
            .machines
            .find_machine(&UniqueKey::Mac(mac.parse().expect("mac")))
            .await
            .expect("find")
        {
            let ev = store
                .events
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
        if fw == Fw::Bios { "pcbios" } else { "efi" }
    );
    if fw == Fw::Arm64 {
        assert_eq!(ev[0].detail["buildarch"], "arm64", "{}", ev[0].detail);
    }
    assert_firmware_path(&log, fw);
}

/// `image_door`: serve kernel and initramfs from the sendfile image door (`[boot].images_listen`)
/// instead of the main port; the install script points there. `ipv6_ra`: the subnet sends IPv6
/// router advertisements (iPXE's IPv6 autoconfiguration then ends at once): the time from VM start
/// to config fetched is printed either way, for the README's table (no timing assertion).
async fn install_vm(tag: &str, uefi: bool, image_door: bool, ipv6_ra: bool) {
    let dir = workdir(tag);
    let d = dir.path();
    let mut lab = Lab::new(tag);
    let cfg = config(d, &lab.br, if ipv6_ra { "ipv6_ra = true\n" } else { "" });
    if image_door {
        let text = std::fs::read_to_string(&cfg).expect("config");
        let text = text.replacen(
            "[boot]\n",
            &format!("[boot]\nimages_listen = \"10.88.0.1:{IMAGE_DOOR_PORT}\"\n"),
            1,
        );
        std::fs::write(&cfg, text).expect("config");
    }
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
    let schematic = plinth::talos::schematic::Schematic::parse(SCHEMATIC)
        .and_then(|s| s.id())
        .expect("schematic id");
    import_image_as(&cfg, &image, Some(schematic.as_str()));

    // The VM, declared; the same config file (database, secret key) as the server.
    let cluster_extra = format!(
        "schematic:\n{}",
        SCHEMATIC
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>()
    );
    let inv = write_inventory(
        d,
        host,
        mac,
        uuid,
        &InventoryExtras {
            cluster: &cluster_extra,
            ..InventoryExtras::default()
        },
    );
    plinth_ok(&["apply", &inv.display().to_string(), "--config", &cfg_s]);
    let token = plinth_ok(&["token", "create", "--role", "operator", "--config", &cfg_s])
        .trim()
        .to_string();

    let plog = serve(&mut lab, d, &cfg);
    let report_dir = start_report_listener(&mut lab, d);

    // Through the API: accept the machine and open its provisioning window.
    lab.cli(&token, &["machine", "state", host, "ready"]);
    lab.cli(&token, &["machine", "provision", host, "--ttl", "3600"]);

    let fw = if uefi { Fw::Uefi } else { Fw::Bios };
    let qemu = start_vm(&mut lab, d, fw, mac, uuid, 512);
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
    eprintln!(
        "{tag}: {} firmware, ipv6_ra {}: VM start to config fetched {:.1} s",
        if uefi { "UEFI" } else { "BIOS" },
        if ipv6_ra { "on" } else { "off" },
        fetched_after.as_secs_f64()
    );
    if ipv6_ra {
        // iPXE solicited a router and was answered (what ended its IPv6 wait).
        let metrics = lab.run("curl", &["-sf", "http://10.88.0.1:8080/metrics"]);
        let solicited = metrics
            .lines()
            .find_map(|l| l.strip_prefix("plinth_ra_sent_total{kind=\"solicited\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        assert!(
            solicited >= 1.0,
            "no solicited router advertisement:\n{metrics}"
        );
    }
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
        plinth::service::machine_config::config_diff(
            std::str::from_utf8(&render.stdout).ok(),
            std::str::from_utf8(&report.body).ok(),
            host
        )
    );
    let yaml = String::from_utf8(report.body.clone()).expect("utf-8 config");
    assert!(yaml.contains(&format!("hostname: {host}")), "{yaml}");

    // The kernel line the VM's kernel got.
    let console = String::from_utf8_lossy(&std::fs::read(&serial).unwrap_or_default()).into_owned();
    let cmdline = console
        .split("plinth-vm: cmdline<<")
        .nth(1)
        .and_then(|rest| rest.split(">>").next())
        .map(|l| l.replace(['\r', '\n'], ""))
        .unwrap_or_else(|| panic!("the VM printed no kernel line:\n{}", tail(&serial, 3000)));
    eprintln!(
        "{tag}: the VM's kernel line: {}?token=<redacted>",
        cmdline.split("?token=").next().unwrap_or_default()
    );
    // iPXE's EFI loader starts an EFI-stub kernel's command line with the image's own name (as
    // UEFI load options do); a BIOS boot gets the line alone.
    let served = if uefi {
        cmdline.strip_prefix("kernel-amd64 ").unwrap_or_else(|| {
            panic!("UEFI iPXE's kernel line starts with the image name kernel-amd64: {cmdline}")
        })
    } else {
        cmdline.as_str()
    };
    let config_url = served.strip_prefix(EXPECTED_CMDLINE).unwrap_or_else(|| {
        panic!("the VM's kernel line\n  {cmdline}\nis not\n  {EXPECTED_CMDLINE}<config URL>")
    });
    assert!(
        config_url.starts_with(&format!("{}/config/", crate::support::vm_lab::SERVER))
            && config_url.contains("?token=")
            && (config_url.contains(&format!("uuid={uuid}"))
                || config_url.contains("uuid=${uuid}")),
        "talos.config={config_url}"
    );
    assert!(
        !config_url.contains(' '),
        "talos.config= is the last argument: {config_url}"
    );

    let store = open_store(d).await;
    let m = store
        .machines
        .find_machine(&UniqueKey::Mac(mac.parse().expect("mac")))
        .await
        .expect("find")
        .expect("the declared machine");
    assert_eq!(m.smbios_uuid.map(|u| u.to_string()).as_deref(), Some(uuid));
    let events = store
        .events
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
    // The boot timeline: the DHCP answers, the TFTP read of ipxe.efi (UEFI; the BIOS ROM is
    // iPXE already), the kernel and initramfs downloads, then the config, in that order.
    let pos = |k: &str, file: Option<&str>| {
        events
            .iter()
            .position(|e| e.kind == k && file.is_none_or(|f| e.detail["file"] == f))
            .unwrap_or_else(|| panic!("{k} {file:?} in the timeline: {kinds:?}"))
    };
    let ack = pos("dhcp.ack", None);
    assert!(ack < pos("http.image", Some("kernel-amd64")), "{kinds:?}");
    assert!(
        pos("http.image", Some("initramfs-amd64.xz")) < pos("config.served", None),
        "{kinds:?}"
    );
    if uefi {
        assert!(ack < pos("tftp.read", Some("ipxe.efi")), "{kinds:?}");
    }
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
        .leases
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
    assert_firmware_path(&log, fw);
    // Which door served the image: the image door logs each answer it completes.
    for file in ["kernel-amd64", "initramfs-amd64.xz"] {
        let by_door = log.lines().any(|l| {
            l.contains("image served")
                && l.contains(&format!("file={file}"))
                && l.contains("status=200")
        });
        assert_eq!(
            by_door, image_door,
            "{file} served by the image door: {by_door}\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bios_vm_with_ipxe_rom_is_discovered() {
    boot_vm("b", Fw::Bios).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uefi_vm_with_ovmf_pxe_is_discovered() {
    boot_vm("u", Fw::Uefi).await;
}

/// ARM64 UEFI: AAVMF's PXE asks with client architecture 11, gets `ipxe-arm64.efi` over TFTP,
/// Debian's ARM64 iPXE then asks again and chains to the script, which registers the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arm64_uefi_vm_boots_arm64_ipxe_and_is_discovered() {
    boot_vm("a", Fw::Arm64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bios_vm_installs_and_fetches_its_rendered_config() {
    // Through the image door: iPXE fetches kernel and initramfs from the sendfile listener.
    install_vm("bi", false, true, false).await;
}

/// As above with `ipv6_ra`: iPXE's router solicitation is answered and its IPv6 wait ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bios_vm_with_ipv6_ra_installs_and_fetches_its_rendered_config() {
    install_vm("br", false, true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uefi_vm_with_ipv6_ra_installs_and_fetches_its_rendered_config() {
    install_vm("ur", true, false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uefi_vm_installs_and_fetches_its_rendered_config() {
    install_vm("ui", true, false, false).await;
}

//! A real VM network-boots through Plinth: a network namespace with a bridge and a tap device,
//! Plinth on the bridge as the authoritative DHCP + TFTP + HTTP server, and qemu (TCG: KVM does not
//! work on these machines) booting once with legacy BIOS and iPXE as the NIC ROM, once with UEFI
//! (OVMF's own PXE on virtio-net: TFTP ipxe.efi, then iPXE, then HTTP). The VM is unknown to Plinth,
//! so it must end up registered as `discovered` with the SMBIOS UUID qemu gave it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plinth::domain::{LifecycleState, UniqueKey};
use plinth::service::{EventFilter, InventoryStore};

const BIN: &str = env!("CARGO_BIN_EXE_plinth");

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

async fn boot_vm(tag: &str, uefi: bool) {
    let dir = tempfile::tempdir().expect("tmp");
    let mut lab = Lab::new(tag);
    let cfg = config(dir.path(), &lab.br);
    let plog = dir.path().join("plinth.log");
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
    let mut args: Vec<String> = [
        "-accel",
        "tcg",
        "-m",
        "256",
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
        &format!("file:{}", dir.path().join("serial.log").display()),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if uefi {
        let vars = dir.path().join("OVMF_VARS.fd");
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
    let qlog = dir.path().join("qemu.log");
    lab.spawn("qemu-system-x86_64", &args, &qlog);

    // Poll the inventory (SQLite in WAL mode: a reader beside the server) until the VM is discovered.
    let url = format!("sqlite://{}", dir.path().join("data/plinth.db").display());
    let store: Arc<dyn InventoryStore> = plinth::store::open(&plinth::store::StoreOptions {
        url,
        max_connections: 1,
        migrate: false,
    })
    .await
    .expect("store");
    let start = Instant::now();
    let mut found = None;
    while start.elapsed() < Duration::from_secs(360) {
        if let Some(m) = store
            .find_machine(&UniqueKey::Mac(mac.parse().expect("mac")))
            .await
            .expect("find")
        {
            found = Some(m);
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let log = std::fs::read_to_string(&plog).unwrap_or_default();
    let serial = std::fs::read_to_string(dir.path().join("serial.log")).unwrap_or_default();
    let tail: String = serial
        .chars()
        .rev()
        .take(3000)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let m = found.unwrap_or_else(|| {
        panic!("the VM never reached /boot/machine.ipxe in {:?}; plinth log:\n{log}\nVM console (tail):\n{tail}", start.elapsed())
    });
    eprintln!("{tag}: VM discovered after {:?}", start.elapsed());
    assert_eq!(m.state, LifecycleState::Discovered);
    assert_eq!(m.smbios_uuid.map(|u| u.to_string()).as_deref(), Some(uuid));
    assert_eq!(m.serial.as_deref(), Some("VM-SERIAL-1"));
    assert_eq!(m.manufacturer.as_deref(), Some("Plinth Test"));
    assert_eq!(m.model.as_deref(), Some("NetBoot VM"));
    let ev = store
        .list_events(&EventFilter {
            machine_id: Some(m.id),
            kind_prefix: Some("boot.".into()),
            after_id: None,
            limit: 10,
        })
        .await
        .expect("ev");
    assert_eq!(ev[0].kind, "boot.discovered");
    assert_eq!(
        ev[0].detail["platform"],
        if uefi { "efi" } else { "pcbios" }
    );
    // The firmware path the VM took, from Plinth's own log.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bios_vm_with_ipxe_rom_is_discovered() {
    boot_vm("b", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uefi_vm_with_ovmf_pxe_is_discovered() {
    boot_vm("u", true).await;
}

//! A stand-in for the Talos image in the VM boot tests: Debian's kernel (`linux-image-amd64`) and
//! an initramfs built here from `busybox-static` and the kernel's virtio-net modules. Its `/init`
//! does what Talos does with `talos.config=` and nothing more: bring the NIC up over DHCP, take
//! the URL from the kernel command line, substitute `${uuid}` with the SMBIOS UUID, fetch the
//! config, then POST the body and its SHA-256 to the test's report URL and power off.
//!
//! `plinth.standin=` on the kernel command line (a cluster's `kernelArgs`) changes the ending:
//! `talos` reports, then starts the Talos API service of the tests (`support::talos_node`: this
//! test binary, stripped, with the shared libraries `ldd` finds, when the image is built with
//! [`build_with_talos_api`]) on 50000 with the config it fetched, as a Talos node's apid with its
//! certificate signed from the config's OS CA, and stays up; `listen` starts a bare TCP listener
//! on 50000 instead; `no-config` reports `status=skipped` instead of fetching the config and
//! stays up (a node that never gets its config). Without it: report and power off.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The files to import with `plinth image import`.
pub struct TalosStandIn {
    /// `/boot/vmlinuz-<version>`.
    pub kernel: PathBuf,
    /// `initramfs-amd64.xz` (xz, or gzip when `xz` is missing: the kernel reads either).
    pub initramfs: PathBuf,
    /// The kernel release.
    pub kernel_release: String,
}

/// The newest Debian kernel whose modules are installed.
fn debian_kernel() -> (PathBuf, String) {
    let mut found: Vec<(PathBuf, String)> = std::fs::read_dir("/boot")
        .map(|d| d.filter_map(Result::ok).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let release = name.strip_prefix("vmlinuz-")?.to_string();
            Path::new("/lib/modules")
                .join(&release)
                .join("modules.dep")
                .is_file()
                .then(|| (e.path(), release))
        })
        .collect();
    found.sort_by(|a, b| a.1.cmp(&b.1));
    found.pop().unwrap_or_else(|| {
        panic!("no /boot/vmlinuz-* with its /lib/modules: apt-get install linux-image-amd64 (.ci/run does)")
    })
}

/// Whether an ELF file has no program interpreter (PT_INTERP), i.e. is statically linked.
fn is_static_elf(bytes: &[u8]) -> bool {
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return false;
    }
    let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into().expect("8 bytes")) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        bytes.len() >= o + 4 && u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4")) != 3
    })
}

fn static_busybox() -> Vec<u8> {
    for p in ["/bin/busybox", "/usr/bin/busybox"] {
        if let Ok(b) = std::fs::read(p) {
            if is_static_elf(&b) {
                return b;
            }
        }
    }
    panic!("no statically linked busybox: apt-get install busybox-static (.ci/run does)")
}

/// The modules that make `wanted` work, in load order (dependencies first), from modules.dep.
/// Paths are relative to `/lib/modules/<release>`; built-in drivers have no entry and are skipped.
fn module_closure(release: &str, wanted: &[&str]) -> Vec<String> {
    let dep = std::fs::read_to_string(Path::new("/lib/modules").join(release).join("modules.dep"))
        .expect("modules.dep");
    let mut deps: HashMap<String, Vec<String>> = HashMap::new();
    for line in dep.lines() {
        if let Some((m, d)) = line.split_once(':') {
            deps.insert(
                m.to_string(),
                d.split_whitespace().map(str::to_string).collect(),
            );
        }
    }
    let base = |p: &str| {
        let f = p.rsplit('/').next().unwrap_or(p);
        f.split(".ko").next().unwrap_or(f).replace('-', "_")
    };
    fn visit(m: &str, deps: &HashMap<String, Vec<String>>, out: &mut Vec<String>) {
        if out.iter().any(|o| o == m) {
            return;
        }
        for d in deps.get(m).into_iter().flatten() {
            visit(d, deps, out);
        }
        out.push(m.to_string());
    }
    let mut out = Vec::new();
    for w in wanted {
        if let Some(m) = deps.keys().find(|k| base(k) == *w) {
            visit(&m.clone(), &deps, &mut out);
        }
    }
    out
}

/// A module's bytes, decompressed when the kernel ships it compressed.
fn module_bytes(release: &str, rel: &str) -> Vec<u8> {
    let path = Path::new("/lib/modules").join(release).join(rel);
    let tool = if rel.ends_with(".ko.xz") {
        Some("xz")
    } else if rel.ends_with(".ko.zst") {
        Some("zstd")
    } else if rel.ends_with(".ko.gz") {
        Some("gzip")
    } else {
        None
    };
    match tool {
        None => std::fs::read(&path).expect("module"),
        Some(t) => {
            let out = Command::new(t)
                .args(["-dc"])
                .arg(&path)
                .output()
                .expect("decompress module");
            assert!(out.status.success(), "{t} -dc {}", path.display());
            out.stdout
        }
    }
}

/// A newc ("070701") cpio archive, the format the kernel unpacks into its initramfs.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) {
        self.ino += 1;
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let fields = [
            self.ino,
            mode,
            0,
            0,
            nlink,
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while self.buf.len() % 4 != 0 {
            self.buf.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[], (0, 0));
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, 0o100000 | mode, data, (0, 0));
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[], (0, 0));
        self.buf
    }
}

/// busybox udhcpc calls this with `bound`, `renew`, `deconfig`...: set the leased address.
const UDHCPC_SCRIPT: &str = r#"#!/bin/sh
case "$1" in
    deconfig) ip addr flush dev "$interface"; ip link set "$interface" up ;;
    bound|renew)
        ip addr flush dev "$interface"
        ip addr add "$ip/${mask:-24}" dev "$interface"
        echo "$ip" > /leased
        echo "plinth-vm: leased $ip on $interface" ;;
esac
exit 0
"#;

/// `/init`. `@MODULES@` and `@REPORT@` are filled in by `build`.
const INIT: &str = r#"#!/bin/sh
# The Talos stand-in of Plinth's VM boot test: fetch the machine config as Talos does, report it.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say() { echo "plinth-vm: $*"; }
# The kernel line this boot got, for the test to compare with what Plinth meant to give; kernel
# messages are kept off the console first so none lands inside the line.
dmesg -n 1
echo "plinth-vm: cmdline<<$(cat /proc/cmdline)>>"
off() { say "$*; powering off"; sync; poweroff -f; sleep 30; }
idle() { say "$*; staying up"; while :; do sleep 3600; done; }
# report STATUS FILE: POST the file with its SHA-256 and length to the test's listener.
report() {
    sum=$(sha256sum "$2" | cut -d' ' -f1)
    len=$(wc -c < "$2")
    i=0
    until wget -q -O /dev/null --post-file "$2" "@REPORT@?status=$1&sha256=$sum&len=$len&uuid=$uuid&substituted=$by&ip=$(cat /leased)"; do
        i=$((i + 1)); [ $i -ge 5 ] && { say "report failed"; return 1; }
        sleep 1
    done
}
for m in @MODULES@; do insmod "/modules/$m" || say "insmod $m failed"; done
ip link set lo up
i=0
until [ -e /sys/class/net/eth0 ]; do
    i=$((i + 1)); [ $i -ge 30 ] && off "no network device"
    sleep 1
done
udhcpc -i eth0 -s /udhcpc.sh -f -q -n -t 10 -T 2 || off "no DHCP lease"
mode=$(sed -n 's/.*plinth\.standin=\([^ ]*\).*/\1/p' /proc/cmdline)
url=$(sed -n 's/.*talos\.config=\([^ ]*\).*/\1/p' /proc/cmdline)
[ -n "$url" ] || off "no talos.config= on the kernel command line"
uuid=$(cat /sys/class/dmi/id/product_uuid)
# Talos substitutes ${uuid} in the query string; iPXE may already have done it.
case "$url" in
    *'${uuid}'*) by=init; url=$(echo "$url" | sed 's/[$][{]uuid[}]/'"$uuid"'/g') ;;
    *) by=ipxe ;;
esac
if [ "$mode" = no-config ]; then
    echo "plinth.standin=no-config" > /skipped
    report skipped /skipped
    idle "not fetching the machine config (plinth.standin=no-config)"
fi
say "fetching the machine config (uuid $uuid, substituted by $by)"
n=0
until wget -q -O /config.yaml "$url" 2>/wget.err; do
    n=$((n + 1))
    if [ $n -ge 5 ]; then cat /wget.err; report fail /wget.err; off "config fetch failed"; fi
    sleep 2
done
report ok /config.yaml && say "config fetched ($(wc -c < /config.yaml) bytes) and reported"
if [ "$mode" = talos ]; then
    [ -x /bin/talos-node ] || off "plinth.standin=talos, but the image has no Talos API service"
    echo '{"config": "/config.yaml", "listen": "0.0.0.0:50000"}' > /node.json
    PLINTH_TEST_TALOS_NODE=/node.json LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/lib64 \
        /bin/talos-node @ENTRY@ &
    idle "Talos API service started on 50000 with the fetched config"
fi
if [ "$mode" = listen ]; then
    mkdir -p /www && echo "Talos API stand-in" > /www/index.html
    httpd -p 50000 -h /www || off "no listener on 50000"
    idle "listening on 50000 as the Talos API would"
fi
off "done"
"#;

/// This test binary, stripped, and the shared libraries it loads (their paths as `ldd` reports
/// them), for `/init` to start as the node's Talos API service.
fn talos_api_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let exe = std::env::current_exe().expect("test binary");
    let stripped = dir.join("talos-node");
    let out = Command::new("objcopy")
        .arg("--strip-all")
        .arg(&exe)
        .arg(&stripped)
        .output()
        .expect("objcopy (binutils)");
    assert!(
        out.status.success(),
        "objcopy --strip-all: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files = vec![(
        "bin/talos-node".to_string(),
        std::fs::read(&stripped).expect("stripped binary"),
    )];
    let out = Command::new("ldd").arg(&exe).output().expect("ldd");
    assert!(out.status.success(), "ldd {}", exe.display());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.trim(),
            None => line.trim(),
        };
        let Some(path) = path
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        else {
            continue;
        };
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        files.push((path.trim_start_matches('/').to_string(), bytes));
    }
    files
}

/// Build the stand-in into `dir`; the init POSTs its report to `report_url`.
pub fn build(dir: &Path, report_url: &str) -> TalosStandIn {
    build_image(dir, report_url, false)
}

/// The stand-in with the Talos API service of the tests in it (`plinth.standin=talos`).
pub fn build_with_talos_api(dir: &Path, report_url: &str) -> TalosStandIn {
    build_image(dir, report_url, true)
}

fn build_image(dir: &Path, report_url: &str, talos_api: bool) -> TalosStandIn {
    let (kernel, release) = debian_kernel();
    // virtio-net (both firmware paths give the VM a virtio-net-pci NIC) and the PCI transport.
    let modules = module_closure(&release, &["virtio_pci", "virtio_net"]);
    assert!(
        modules.iter().any(|m| m.contains("virtio_net")),
        "virtio_net is not a module of {release}"
    );
    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "proc", "sys", "modules", "tmp"] {
        cpio.dir(d);
    }
    // The kernel opens /dev/console for init before devtmpfs is mounted.
    cpio.entry("dev/console", 0o020600, &[], (5, 1));
    cpio.file("bin/busybox", 0o755, &static_busybox());
    cpio.entry("bin/sh", 0o120777, b"busybox", (0, 0));
    let mut names = Vec::new();
    for (i, m) in modules.iter().enumerate() {
        let base = m.rsplit('/').next().unwrap_or(m);
        let name = format!("{i:02}-{}.ko", base.split(".ko").next().unwrap_or(base));
        cpio.file(
            &format!("modules/{name}"),
            0o644,
            &module_bytes(&release, m),
        );
        names.push(name);
    }
    cpio.file("udhcpc.sh", 0o755, UDHCPC_SCRIPT.as_bytes());
    if talos_api {
        let mut dirs: Vec<String> = Vec::new();
        for (path, bytes) in talos_api_files(dir) {
            let mut at = String::new();
            for part in path
                .split('/')
                .collect::<Vec<_>>()
                .split_last()
                .map_or(&[][..], |(_, d)| d)
            {
                at = if at.is_empty() {
                    part.to_string()
                } else {
                    format!("{at}/{part}")
                };
                if at != "bin" && !dirs.contains(&at) {
                    cpio.dir(&at);
                    dirs.push(at.clone());
                }
            }
            cpio.file(&path, 0o755, &bytes);
        }
    }
    let init = INIT
        .replace("@MODULES@", &names.join(" "))
        .replace("@REPORT@", report_url)
        .replace("@ENTRY@", &super::reexec::ARGS.join(" "));
    cpio.file("init", 0o755, init.as_bytes());
    let archive = cpio.finish();

    // Talos ships xz; the kernel's xz decoder wants CRC32 (not xz's default CRC64).
    let xz = Command::new("xz").arg("--version").output().is_ok();
    let mut c = if xz {
        let mut c = Command::new("xz");
        c.args(["--check=crc32", "-6", "-c"]);
        c
    } else {
        let mut c = Command::new("gzip");
        c.args(["-9", "-n", "-c"]);
        c
    };
    let initramfs = dir.join("initramfs-amd64.xz");
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&initramfs).expect("initramfs"))
        .spawn()
        .expect("compressor");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&archive)
        .expect("compress");
    assert!(child.wait().expect("compressor").success(), "compressor");
    TalosStandIn {
        kernel,
        initramfs,
        kernel_release: release,
    }
}

/// What the local disk prints on the serial console when the VM boots it.
pub const LOCAL_DISK_BANNER: &str = "plinth-vm: booted from the local disk";

/// The VM's "local disk": a raw 1 MiB image whose MBR boot sector writes
/// [`LOCAL_DISK_BANNER`] to COM1 and halts, so a VM that boots its disk says so on the console
/// and never reaches the network.
pub fn local_disk(dir: &Path) -> PathBuf {
    // Real mode at 0x7c00: cli; cld; xor ax,ax; mov ds,ax; mov si,msg; mov dx,0x3f8;
    // next: lodsb; test al,al; jz halt; out dx,al; jmp next; halt: hlt; jmp halt; msg: ...
    const CODE_LEN: u16 = 0x17;
    let msg_addr = (0x7c00 + CODE_LEN).to_le_bytes();
    let mut sector: Vec<u8> = vec![
        0xFA,
        0xFC,
        0x31,
        0xC0,
        0x8E,
        0xD8,
        0xBE,
        msg_addr[0],
        msg_addr[1],
        0xBA,
        0xF8,
        0x03,
        0xAC,
        0x84,
        0xC0,
        0x74,
        0x03,
        0xEE,
        0xEB,
        0xF8,
        0xF4,
        0xEB,
        0xFD,
    ];
    assert_eq!(sector.len(), usize::from(CODE_LEN));
    sector.extend_from_slice(format!("\r\n{LOCAL_DISK_BANNER}\r\n\0").as_bytes());
    assert!(sector.len() <= 510);
    sector.resize(510, 0);
    sector.extend_from_slice(&[0x55, 0xAA]);
    sector.resize(1 << 20, 0);
    let path = dir.join("local-disk.img");
    std::fs::write(&path, sector).expect("disk image");
    path
}

#[test]
fn local_disk_has_a_boot_signature() {
    let dir = tempfile::tempdir().expect("tmp");
    let img = std::fs::read(local_disk(dir.path())).expect("read");
    assert_eq!(img.len(), 1 << 20);
    assert_eq!(&img[510..512], &[0x55, 0xAA]);
    assert!(img[..510]
        .windows(LOCAL_DISK_BANNER.len())
        .any(|w| w == LOCAL_DISK_BANNER.as_bytes()));
}

#[test]
fn cpio_entries_are_aligned_and_terminated() {
    let mut c = Cpio::default();
    c.dir("bin");
    c.file("init", 0o755, b"#!/bin/sh\n");
    let a = c.finish();
    assert_eq!(a.len() % 4, 0);
    assert!(a.starts_with(b"070701"));
    assert!(a.windows(10).any(|w| w == b"TRAILER!!!"));
}

/// A directory with the iPXE binaries of a newer Debian `ipxe` package, which (unlike Debian 12's)
/// has `ipxe-arm64.efi`: obtained once per target directory with the project's own
/// `ipxe/fetch.sh --debian`, which verifies the archive's signature and checksums.
pub fn debian_ipxe_dir() -> PathBuf {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ipxe-debian");
    if !dir.join("ipxe-arm64.efi").is_file() {
        let out = Command::new("sh")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("ipxe/fetch.sh"))
            .args(["--debian", "trixie,forky,sid"])
            .arg(&dir)
            .output()
            .expect("run ipxe/fetch.sh");
        assert!(
            out.status.success() && dir.join("ipxe-arm64.efi").is_file(),
            "ipxe/fetch.sh --debian trixie,forky,sid {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

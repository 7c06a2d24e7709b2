//! The lab of the VM tests: a network namespace with a bridge (Plinth's side, 10.88.0.1/24) and a
//! tap device (the VM's cable); Plinth (the real binary) in it as DHCP + TFTP + HTTP server; the
//! declarative inventory of one VM; a busybox httpd that keeps what the VM's init reports; qemu's
//! command line; and the plinth CLI. Every process started in the lab is killed by PID on drop
//! (with the processes named by registered pid files, e.g. a qemu started by a test BMC), then
//! the namespace is deleted.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use plinth::service::Stores;

use super::vm_image::TalosStandIn;

pub const BIN: &str = env!("CARGO_BIN_EXE_plinth");
/// The Talos version the test cluster targets (its schema is in ../shared/talos/schemas).
pub const TALOS: &str = "v1.11.6";
/// Where the VM's init reports what it fetched (busybox httpd in the namespace).
pub const REPORT_PORT: u16 = 8099;
/// Plinth's HTTP front door in the lab.
pub const SERVER: &str = "http://10.88.0.1:8080";
/// How long one CLI command may take before `timeout` kills it.
pub const CLI_LIMIT_SECS: &str = "120";

pub fn ip(args: &[&str]) {
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
pub struct Lab {
    pub ns: String,
    pub br: String,
    pub tap: String,
    children: Vec<Child>,
    pidfiles: Vec<PathBuf>,
}

impl Lab {
    pub fn new(tag: &str) -> Lab {
        let n = std::process::id() % 100_000;
        let lab = Lab {
            ns: format!("plinth-vm{tag}{n}"),
            br: format!("plbr{tag}{n}"),
            tap: format!("pltap{tag}{n}"),
            children: vec![],
            pidfiles: vec![],
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

    pub fn spawn(&mut self, program: &str, args: &[String], log: &Path) -> usize {
        self.spawn_env(program, args, &[], log)
    }

    /// Start `program` in the namespace with extra environment variables; stdout and stderr go
    /// to `log`. The index of the process in the lab.
    pub fn spawn_env(
        &mut self,
        program: &str,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> usize {
        let f = std::fs::File::create(log).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, program])
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("dup"))
            .stderr(f)
            .spawn()
            .expect("spawn");
        self.children.push(child);
        self.children.len() - 1
    }

    /// Whether the process started as `idx` has exited.
    pub fn exited(&mut self, idx: usize) -> bool {
        matches!(self.children[idx].try_wait(), Ok(Some(_)))
    }

    /// Wait (at most `limit`) for the process started as `idx` to exit; its success.
    pub fn wait_exit(&mut self, idx: usize, limit: Duration) -> Option<bool> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(st)) = self.children[idx].try_wait() {
                return Some(st.success());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        None
    }

    /// Kill, on drop, the process whose PID a started process writes to `path` (after the
    /// processes of the lab, so a BMC does not start it again). `path` must outlive the lab:
    /// drop the lab before the directory that holds it.
    pub fn kill_pidfile_on_drop(&mut self, path: &Path) {
        self.pidfiles.push(path.to_path_buf());
    }

    /// Run a command in the namespace to completion (killed after `CLI_LIMIT_SECS`); its output.
    pub fn output(&self, program: &str, args: &[&str]) -> std::process::Output {
        Command::new("ip")
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
            .expect("run in netns")
    }

    /// Run a command in the namespace to completion; its stdout, or a panic with its output.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let out = self.output(program, args);
        assert!(
            out.status.success(),
            "{program} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The plinth CLI against the lab's server with `token`; its stdout, or a panic.
    pub fn cli(&self, token: &str, args: &[&str]) -> String {
        let mut a = args.to_vec();
        a.extend(["--server", SERVER, "--token", token]);
        self.run(BIN, &a)
    }

    /// `GET` an API path of the lab's server as JSON.
    pub fn api_get(&self, token: &str, path: &str) -> serde_json::Value {
        let body = self.run(
            "curl",
            &[
                "-sf",
                "--max-time",
                "30",
                "-H",
                &format!("Authorization: Bearer {token}"),
                &format!("{SERVER}/api/v1{path}"),
            ],
        );
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for p in &self.pidfiles {
            let Some(pid) = std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            else {
                continue;
            };
            // Only the process the file names, and only while it still is qemu.
            let is_qemu = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("qemu"));
            if is_qemu {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// The test's working directory (config, database, logs, VM console); kept for a look afterwards
/// when `PLINTH_VM_KEEP` is set.
pub fn workdir(tag: &str) -> tempfile::TempDir {
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

/// Plinth's config file for the lab; `extra` is appended (whole tables, e.g. `[workflows]`).
pub fn config(dir: &Path, br: &str, extra: &str) -> PathBuf {
    let text = format!(
        r#"data_dir = "{data}"
[http]
listen = "10.88.0.1:8080"
[secrets]
key_file = "{key}"
[boot]
public_url = "{SERVER}"
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
{extra}"#,
        data = dir.join("data").display(),
        key = dir.join("secret.key").display(),
        ipxe = dir.join("ipxe").display(),
        schemas = super::shared().join("talos/schemas").display(),
    );
    // The iPXE binaries, from Debian's package, through the project's own script.
    let st = Command::new("sh")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("ipxe/fetch.sh"))
        .arg(dir.join("ipxe"))
        .stdout(Stdio::null())
        .status()
        .expect("fetch.sh");
    assert!(st.success(), "ipxe/fetch.sh");
    super::write_key(&dir.join("secret.key"));
    let p = dir.join("plinth.toml");
    std::fs::write(&p, text).expect("config");
    p
}

pub fn wait_for_line(log: &Path, needle: &str, limit: Duration) -> bool {
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
pub fn tail(path: &Path, n: usize) -> String {
    let s = String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned();
    let skip = s.chars().count().saturating_sub(n);
    s.chars().skip(skip).collect()
}

/// Run the plinth CLI outside the namespace (commands that only touch the database and files).
pub fn plinth(args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .args([CLI_LIMIT_SECS, BIN])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("plinth")
}

pub fn plinth_ok(args: &[&str]) -> String {
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
pub fn serve(lab: &mut Lab, dir: &Path, cfg: &Path) -> PathBuf {
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

/// `plinth image import` of the stand-in as the cluster's Talos version.
pub fn import_image(cfg: &Path, image: &TalosStandIn) {
    import_image_as(cfg, image, None);
}

/// Import the stand-in as the kernel and initramfs of `schematic` (default: the vanilla one).
pub fn import_image_as(cfg: &Path, image: &TalosStandIn, schematic: Option<&str>) {
    let cfg = cfg.display().to_string();
    let kernel = image.kernel.display().to_string();
    let initramfs = image.initramfs.display().to_string();
    let mut args = vec![
        "image",
        "import",
        "--config",
        &cfg,
        "--version",
        TALOS,
        "--arch",
        "amd64",
        "--kernel",
        &kernel,
        "--initramfs",
        &initramfs,
    ];
    if let Some(s) = schematic {
        args.extend(["--schematic", s]);
    }
    plinth_ok(&args);
}

/// A reader of the server's SQLite database (WAL mode: beside the running server).
pub async fn open_store(dir: &Path) -> Stores {
    let url = format!("sqlite://{}", dir.join("data/plinth.db").display());
    plinth::store::open(&plinth::store::StoreOptions {
        url,
        max_connections: 1,
        migrate: false,
    })
    .await
    .expect("store")
}

/// What the inventory of a VM test declares beyond the VM itself.
#[derive(Default)]
pub struct InventoryExtras<'a> {
    /// Extra kernel arguments of the cluster (after `console=ttyS0 panic=-1`).
    pub kernel_args: &'a [&'a str],
    /// Extra YAML of the Cluster document (e.g. its `reinstall:` policy).
    pub cluster: &'a str,
    /// Extra YAML of the Machine document (e.g. its `bmc:`).
    pub machine: &'a str,
    /// The machine's role: `worker` unless given.
    pub role: Option<&'a str>,
}

/// The declarative inventory of the install tests: one cluster (secrets outside the directory),
/// one profile with install-disk rules, and the VM.
pub fn write_inventory(
    dir: &Path,
    host: &str,
    mac: &str,
    uuid: &str,
    extras: &InventoryExtras,
) -> PathBuf {
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
    let extra_args: String = extras
        .kernel_args
        .iter()
        .map(|a| format!("  - {a}\n"))
        .collect();
    // No `schematic`: the vanilla schematic, which `plinth image import` also defaults to.
    std::fs::write(
        inv.join("clusters/vmlab.yaml"),
        format!(
            "kind: Cluster\nname: vmlab\nendpoint: https://10.88.0.10:6443\ntalosVersion: {TALOS}\n\
             secrets: {}\n\
             # The stand-in's console: the serial port (the test's VM console log).\n\
             kernelArgs:\n  - console=ttyS0\n  - panic=-1\n{extra_args}{}",
            secrets.display(),
            extras.cluster,
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
            "kind: Machine\nhostname: {host}\nsmbios_uuid: {uuid}\nrole: {role}\ncluster: vmlab\nprofile: qemu\n\
             interfaces:\n  - mac: \"{mac}\"\n    boot: true\n\
             # The install disk by the profile's rules (16 GiB SSD), and a data disk.\n\
             disks:\n  - serial: QM00001\n    model: QEMU HARDDISK\n    size_bytes: 17179869184\n    type: ssd\n\
             \x20 - serial: QM00002\n    model: QEMU HARDDISK\n    size_bytes: 107374182400\n    type: hdd\n{}",
            extras.machine,
            role = extras.role.unwrap_or("worker"),
        ),
    )
    .expect("machine");
    inv
}

/// What the VM's init reported: the query string's fields and the POSTed body.
pub struct Report {
    pub fields: HashMap<String, String>,
    pub body: Vec<u8>,
}

fn parse_fields(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// busybox httpd in the namespace with one CGI script that keeps what the VM POSTs (the last
/// report in `body` and `fields`, every report's fields as a line of `all`).
pub fn start_report_listener(lab: &mut Lab, dir: &Path) -> PathBuf {
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
             printf '%s\\n' \"$QUERY_STRING\" >> '{out}/all'\n\
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

/// The last report, if any.
pub fn read_report(out: &Path) -> Option<Report> {
    let fields = std::fs::read_to_string(out.join("fields")).ok()?;
    let body = std::fs::read(out.join("body")).ok()?;
    Some(Report {
        fields: parse_fields(&fields),
        body,
    })
}

/// The fields of every report so far, oldest first.
pub fn all_reports(out: &Path) -> Vec<HashMap<String, String>> {
    std::fs::read_to_string(out.join("all"))
        .unwrap_or_default()
        .lines()
        .map(parse_fields)
        .collect()
}

/// How qemu is started.
pub struct VmSpec<'a> {
    /// OVMF instead of SeaBIOS.
    pub uefi: bool,
    /// An ARM64 VM (qemu's `virt` board with Debian's AAVMF, its own PXE on virtio-net) instead
    /// of an x86-64 one; `uefi` is implied.
    pub arm64: bool,
    pub mac: &'a str,
    pub uuid: &'a str,
    pub mem_mb: u32,
    /// The console: appended to, so it keeps every boot of the VM.
    pub serial: &'a Path,
    /// A raw disk image, the VM's "local disk".
    pub disk: Option<&'a Path>,
    /// The working directory (UEFI variables, a traffic dump with `PLINTH_VM_KEEP`).
    pub dir: &'a Path,
}

/// qemu's command line (program first) for `vm` on the lab's tap, without `-boot`.
pub fn qemu_command(lab: &Lab, vm: &VmSpec) -> Vec<String> {
    let mut args: Vec<String> = [
        if vm.arm64 {
            "qemu-system-aarch64"
        } else {
            "qemu-system-x86_64"
        },
        "-accel",
        "tcg",
        "-m",
        &vm.mem_mb.to_string(),
        "-smp",
        "1",
        "-display",
        "none",
        "-vga",
        "none",
        "-no-reboot",
        "-uuid",
        vm.uuid,
        "-smbios",
        "type=1,serial=VM-SERIAL-1,manufacturer=Plinth Test,product=NetBoot VM",
        "-netdev",
        &format!("tap,id=n0,ifname={},script=no,downscript=no", lab.tap),
        "-chardev",
        &format!("file,id=con0,path={},append=on", vm.serial.display()),
        "-serial",
        "chardev:con0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(disk) = vm.disk {
        args.extend([
            "-drive".to_string(),
            format!("file={},format=raw,if=ide", disk.display()),
        ]);
    }
    // UEFI: the board, the firmware's code and the template of its variable store. No NIC ROM:
    // the firmware's own virtio-net driver and PXE do the first stage.
    let uefi: Option<(&[&str], &str, &str)> = if vm.arm64 {
        Some((
            &["-machine", "virt", "-cpu", "cortex-a57"],
            "/usr/share/AAVMF/AAVMF_CODE.fd",
            "/usr/share/AAVMF/AAVMF_VARS.fd",
        ))
    } else if vm.uefi {
        Some((
            &["-machine", "q35"],
            "/usr/share/OVMF/OVMF_CODE.fd",
            "/usr/share/OVMF/OVMF_VARS.fd",
        ))
    } else {
        None
    };
    if let Some((board, code, vars_template)) = uefi {
        let vars = vm
            .dir
            .join(Path::new(vars_template).file_name().expect("a file name"));
        std::fs::copy(vars_template, &vars).unwrap_or_else(|e| panic!("{vars_template}: {e}"));
        args.extend(board.iter().map(|a| a.to_string()));
        args.extend([
            "-drive".to_string(),
            format!("if=pflash,format=raw,readonly=on,file={code}"),
            "-drive".into(),
            format!("if=pflash,format=raw,file={}", vars.display()),
            "-device".into(),
            format!("virtio-net-pci,netdev=n0,mac={},romfile=", vm.mac),
        ]);
    } else {
        // SeaBIOS with Debian's iPXE as the NIC's option ROM (ipxe-qemu).
        args.extend([
            "-device".to_string(),
            format!("virtio-net-pci,netdev=n0,mac={}", vm.mac),
        ]);
    }
    if std::env::var_os("PLINTH_VM_KEEP").is_some() {
        // The VM's traffic too, for a look with tcpdump or Wireshark.
        args.extend([
            "-object".to_string(),
            format!(
                "filter-dump,id=f0,netdev=n0,file={}",
                vm.dir.join("vm.pcap").display()
            ),
        ]);
    }
    args
}

/// Poll `check` every `every` until it gives a value or `limit` passes.
pub async fn poll<T, F, Fut>(limit: Duration, every: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// qemu arguments that leave OVMF or AAVMF one way to boot from the network, UEFI HTTP boot over
/// IPv4, as on a server whose PXE is disabled in its setup: the firmware's own fw_cfg switches
/// (`opt/org.tianocore/IPv4PXESupport`, `.../IPv6Support`, see edk2's OvmfPkg/RUNTIME_CONFIG.md)
/// turn off its PXE and its IPv6 stack, so with `-boot order=n` the first network option is
/// "UEFI HTTPv4 (MAC:...)".
pub fn http_boot_only_args() -> Vec<String> {
    [
        "-fw_cfg",
        "name=opt/org.tianocore/IPv4PXESupport,string=no",
        "-fw_cfg",
        "name=opt/org.tianocore/IPv6Support,string=no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `cfg` (from [`config`]) with Plinth's TFTP server off, so a firmware that fell back to PXE
/// would find nothing to fetch.
pub fn without_tftp(cfg: &Path) {
    let text = std::fs::read_to_string(cfg).expect("config");
    assert!(text.contains("[tftp]\nenabled = true\n"), "{text}");
    let text = text.replacen("[tftp]\nenabled = true\n", "[tftp]\nenabled = false\n", 1);
    std::fs::write(cfg, text).expect("config");
}

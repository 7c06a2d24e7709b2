//! `plinth doctor`: check what an operator gets wrong before the first machine boots, one line per
//! check (`ok`, `warn` or `fail`, what was checked, and the command or setting that fixes it):
//! the settings found, the network interfaces and addresses the settings name, whether each port
//! can be bound (or is already held by a running Plinth), the capabilities ports below 1024 need,
//! the iPXE binary of each firmware, the database (reachable, migrated), the secret key (present,
//! private, the one the database's secrets are sealed with), the Talos images of every declared
//! cluster, and each BMC over its TLS mode. `--json` prints the same as one object; any failed
//! check makes the exit status non-zero.
//!
//! It only reads: it never creates a database, a data directory or a key, never migrates, and
//! writes no event. Ports are tried with a socket bound and closed at once.
//!
//! Imports `cli::database`, `cli::output`, `app` (to open the store and to reach BMCs), `config`,
//! `domain`, `images`, `store::redact_url` and the service types it reads.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use clap::Args;
use futures::StreamExt;
use serde::Serialize;
use serde_json::json;

use super::database::{sqlite_file, Settings, SettingsArgs};
use super::output::{say, JsonArg};
use crate::config::{Config, SecretKeySource};
use crate::domain::dhcp::{Firmware, IPXE_BINARIES};
use crate::service::ports::{MachineFilter, Stores};
use crate::service::provisioning::{BootFiles, FileRefusal};

/// `plinth doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Do not contact the BMCs of the inventory.
    #[arg(long)]
    pub no_bmc: bool,
    /// Seconds to wait for each BMC.
    #[arg(long, default_value_t = 5, value_name = "SECONDS")]
    pub bmc_timeout: u64,
    /// Settings and database.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Output.
    #[command(flatten)]
    pub out: JsonArg,
}

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
struct Check {
    status: Status,
    /// What was checked, e.g. `port 67/udp (dhcp.port)`.
    check: String,
    /// What was found.
    detail: String,
    /// The command or setting that fixes it, when not ok.
    fix: Option<String>,
}

/// The checks made so far.
#[derive(Default)]
struct Report {
    checks: Vec<Check>,
}

impl Report {
    fn ok(&mut self, check: impl Into<String>, detail: impl Into<String>) {
        self.push(Status::Ok, check, detail, None::<String>);
    }

    fn warn(
        &mut self,
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.push(Status::Warn, check, detail, Some(fix));
    }

    fn fail(
        &mut self,
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.push(Status::Fail, check, detail, Some(fix));
    }

    fn push(
        &mut self,
        status: Status,
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: Option<impl Into<String>>,
    ) {
        self.checks.push(Check {
            status,
            check: check.into(),
            detail: detail.into(),
            fix: fix.map(Into::into),
        });
    }

    fn count(&self, s: Status) -> usize {
        self.checks.iter().filter(|c| c.status == s).count()
    }

    /// Print the report; an error when a check failed.
    fn finish(self, json_out: bool) -> anyhow::Result<()> {
        let (ok, warn, fail) = (
            self.count(Status::Ok),
            self.count(Status::Warn),
            self.count(Status::Fail),
        );
        if json_out {
            say(serde_json::to_string_pretty(&json!({
                "checks": self.checks,
                "summary": {"ok": ok, "warn": warn, "fail": fail},
            }))
            .unwrap_or_default());
        } else {
            for c in &self.checks {
                let fix = c
                    .fix
                    .as_deref()
                    .map(|f| format!("; fix: {f}"))
                    .unwrap_or_default();
                say(format!(
                    "{:<4}  {}: {}{fix}",
                    c.status.as_str(),
                    c.check,
                    c.detail
                ));
            }
            say(format!("{ok} ok, {warn} warning(s), {fail} failed"));
        }
        if fail > 0 {
            anyhow::bail!("{fail} check(s) failed (see the lines marked fail)");
        }
        Ok(())
    }
}

/// Run `plinth doctor` with the settings as `Cli::settings` found them (or why they could not
/// be loaded: that is the first failed check).
pub async fn run(
    settings: anyhow::Result<Option<Settings>>,
    args: &DoctorArgs,
) -> anyhow::Result<()> {
    let mut r = Report::default();
    let settings = match settings {
        Ok(Some(s)) => s,
        Ok(None) => anyhow::bail!("doctor: the settings were not loaded"),
        Err(e) => {
            r.fail(
                "settings",
                format!("{e:#}"),
                "fix the file or key named (plinth.example.toml lists every key), then run `plinth doctor` again",
            );
            return r.finish(args.out.json);
        }
    };
    let config = &settings.config;
    r.ok(
        "settings",
        format!(
            "{}; data directory {}",
            settings.file,
            shown(&config.data_dir)
        ),
    );
    let locals = local_addresses();
    interfaces(&mut r, config, &locals);
    addresses(&mut r, config, &locals);
    let sockets = SocketTable::read();
    for p in ports(config) {
        port(&mut r, &p, &sockets, &locals);
    }
    capabilities(&mut r, config);
    ipxe(&mut r, config);
    let stores = database(&mut r, config).await;
    let key_ok = secret_key(&mut r, config, stores.as_ref()).await;
    if let Some(stores) = &stores {
        images(&mut r, config, stores).await;
        if !args.no_bmc {
            bmcs(
                &mut r,
                config,
                stores,
                key_ok,
                std::time::Duration::from_secs(args.bmc_timeout.max(1)),
            )
            .await;
        }
    }
    r.finish(args.out.json)
}

/// A path as the user should read it: absolute.
fn shown(p: &Path) -> String {
    std::path::absolute(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

/// The addresses of this host's interfaces, by interface name.
fn local_addresses() -> Vec<(String, IpAddr)> {
    if_addrs::get_if_addrs()
        .unwrap_or_default()
        .into_iter()
        .map(|i| (i.name.clone(), i.ip()))
        .collect()
}

/// Whether this host may bind `ip`: one of its addresses, the wildcard, or loopback.
fn is_local(ip: IpAddr, locals: &[(String, IpAddr)]) -> bool {
    ip.is_unspecified() || ip.is_loopback() || locals.iter().any(|(_, a)| *a == ip)
}

/// The network interfaces of this host (Linux: `/sys/class/net`, which lists those without an
/// address too).
fn interface_names(locals: &[(String, IpAddr)]) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = std::fs::read_dir("/sys/class/net")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.extend(locals.iter().map(|(n, _)| n.clone()));
    names
}

/// `dhcp.interfaces`: each exists, and has an IPv4 address.
fn interfaces(r: &mut Report, config: &Config, locals: &[(String, IpAddr)]) {
    let Some(d) = &config.dhcp else { return };
    let names = interface_names(locals);
    let have = names.iter().cloned().collect::<Vec<_>>().join(", ");
    if d.interfaces.is_empty() {
        r.ok(
            "dhcp.interfaces",
            format!("not set: DHCP answers on every interface ({have})"),
        );
        return;
    }
    for (i, name) in d.interfaces.iter().enumerate() {
        let check = format!("interface {name} (dhcp.interfaces[{i}])");
        if !names.contains(name) {
            r.fail(
                check,
                format!("this host has no interface `{name}`; it has: {have}"),
                format!(
                    "set dhcp.interfaces to interfaces of this host (`ip -br link`), e.g. [\"{}\"]",
                    names
                        .iter()
                        .find(|n| *n != "lo")
                        .map_or("eth0", String::as_str)
                ),
            );
            continue;
        }
        let v4: Vec<String> = locals
            .iter()
            .filter(|(n, a)| n == name && a.is_ipv4())
            .map(|(_, a)| a.to_string())
            .collect();
        if v4.is_empty() {
            r.warn(
                check,
                "exists but has no IPv4 address: DHCP answers from it carry no server address of its own",
                format!("give it an address on its subnet (`ip addr add ADDR/PREFIX dev {name}`) or the netplan/ifupdown equivalent"),
            );
        } else {
            r.ok(check, format!("up with {}", v4.join(", ")));
        }
    }
}

/// Addresses the settings name that must be this host's (`dhcp.subnet[].server_ip`) or that
/// booting machines must reach (`boot.public_url`, `dhcp.boot_url`).
fn addresses(r: &mut Report, config: &Config, locals: &[(String, IpAddr)]) {
    let mine: Vec<String> = locals
        .iter()
        .filter(|(_, a)| a.is_ipv4() && !a.is_loopback())
        .map(|(n, a)| format!("{a} ({n})"))
        .collect();
    let mine = if mine.is_empty() {
        "none but loopback".to_string()
    } else {
        mine.join(", ")
    };
    if let Some(d) = &config.dhcp {
        for (i, s) in d.subnets.iter().enumerate() {
            let check = format!("dhcp.subnet[{i}].server_ip {}", s.server_ip);
            if is_local(IpAddr::V4(s.server_ip), locals) {
                r.ok(check, format!("an address of this host (subnet {})", s.net));
            } else {
                r.warn(
                    check,
                    format!("not an address of this host (it has: {mine}); clients of {} are told to send renewals and fetch boot files there", s.net),
                    "set server_ip to this host's address on the subnet, or (behind a relay) the address the relay forwards to; leave it only if a NAT or load balancer forwards that address here",
                );
            }
        }
    }
    let mut urls: Vec<(&str, &str)> = Vec::new();
    if let Some(u) = &config.boot_public_url {
        urls.push(("boot.public_url", u));
    }
    if let Some(d) = &config.dhcp {
        if config.boot_public_url.as_deref() != Some(d.boot_url.as_str()) {
            urls.push(("dhcp.boot_url", &d.boot_url));
        }
    }
    for (key, u) in urls {
        let check = format!("{key} {u}");
        let host = url::Url::parse(u)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string));
        let Some(host) = host else {
            r.fail(
                check,
                "has no host",
                format!("set {key} to http://ADDRESS:PORT"),
            );
            continue;
        };
        match host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) if ip.is_loopback() || ip.is_unspecified() => r.fail(
                check,
                format!("{ip} is not an address a booting machine can reach"),
                format!("set {key} to this host's address on the boot network (this host has: {mine})"),
            ),
            Ok(ip) if !is_local(ip, locals) => r.warn(
                check,
                format!("{ip} is not an address of this host (it has: {mine})"),
                format!("set {key} to this host's address, unless a NAT or load balancer forwards {ip} here"),
            ),
            Ok(_) => r.ok(check, "an address of this host"),
            Err(_) => r.ok(
                check,
                format!("a host name: booting machines must resolve `{host}` (UEFI HTTP boot through the subnet's dns servers)"),
            ),
        }
    }
}

/// Transport protocol of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// A port the server binds.
struct Port {
    what: &'static str,
    key: &'static str,
    proto: Proto,
    addr: SocketAddr,
}

/// Every port the settings make the server bind.
fn ports(config: &Config) -> Vec<Port> {
    let mut out = vec![Port {
        what: "HTTP",
        key: "http.listen",
        proto: Proto::Tcp,
        addr: config.http_listen,
    }];
    if let Some(a) = config.images_listen {
        out.push(Port {
            what: "image door",
            key: "boot.images_listen",
            proto: Proto::Tcp,
            addr: a,
        });
    }
    if let Some(t) = &config.tftp {
        out.push(Port {
            what: "TFTP",
            key: "tftp.listen",
            proto: Proto::Udp,
            addr: t.listen,
        });
    }
    if let Some(d) = &config.dhcp {
        let any = |p: u16| SocketAddr::from((Ipv4Addr::UNSPECIFIED, p));
        out.push(Port {
            what: "DHCP",
            key: "dhcp.port",
            proto: Proto::Udp,
            addr: any(d.port),
        });
        if let Some(p) = d.proxy_port {
            out.push(Port {
                what: "proxyDHCP",
                key: "dhcp.proxy_port",
                proto: Proto::Udp,
                addr: any(p),
            });
        }
    }
    out
}

/// Try to bind a port the way nothing else could share it (no `SO_REUSEADDR`), then close it.
fn try_bind(p: &Port) -> std::io::Result<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let (ty, proto) = match p.proto {
        Proto::Tcp => (Type::STREAM, Protocol::TCP),
        Proto::Udp => (Type::DGRAM, Protocol::UDP),
    };
    let s = Socket::new(Domain::for_address(p.addr), ty, Some(proto))?;
    s.bind(&p.addr.into())
}

/// One port: bindable, held by a running Plinth, or why not.
fn port(r: &mut Report, p: &Port, sockets: &SocketTable, locals: &[(String, IpAddr)]) {
    let check = format!("{} {}/{} ({})", p.what, p.addr, p.proto.as_str(), p.key);
    if p.addr.port() == 0 {
        r.ok(check, "port 0: the system picks a free port at start");
        return;
    }
    match try_bind(p) {
        Ok(()) => r.ok(check, "free: can be bound"),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            match sockets.holder(p.proto, p.addr.port()) {
                Some(h) if h.name == "plinth" => r.ok(
                    check,
                    format!("held by a running plinth (pid {})", h.pid),
                ),
                Some(h) => r.fail(
                    check,
                    format!("in use by {} (pid {})", h.name, h.pid),
                    format!(
                        "stop {} (`systemctl stop {}` if it is a service) or set {} to a free port",
                        h.name, h.name, p.key
                    ),
                ),
                None => r.fail(
                    check,
                    "in use by another process (not found in /proc: run as root to see which)",
                    format!(
                        "find it with `ss -lpn 'sport = :{}'` and stop it, or set {} to a free port",
                        p.addr.port(),
                        p.key
                    ),
                ),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => r.fail(
            check,
            format!("binding it is not permitted: {e}"),
            "run as root, or `setcap cap_net_bind_service,cap_net_raw=+ep $(command -v plinth)` (systemd: AmbientCapabilities=CAP_NET_BIND_SERVICE CAP_NET_RAW)",
        ),
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable
            || !is_local(p.addr.ip(), locals) =>
        {
            r.fail(
                check,
                format!("{} is not an address of this host: {e}", p.addr.ip()),
                format!("set {} to an address of this host, or 0.0.0.0:{}", p.key, p.addr.port()),
            )
        }
        Err(e) => r.fail(check, format!("cannot be bound: {e}"), format!("check {}", p.key)),
    }
}

/// A process holding a socket.
struct Holder {
    pid: u32,
    name: String,
}

/// Which process holds which local port, from `/proc` (Linux): the listening TCP and the bound
/// UDP sockets of `/proc/net/{tcp,tcp6,udp,udp6}` by inode, and the processes whose descriptors
/// point at those inodes. Read once per run; processes this user may not inspect are left out.
#[derive(Default)]
struct SocketTable {
    /// (protocol, port) -> socket inodes.
    inodes: HashMap<(&'static str, u16), Vec<u64>>,
    /// socket inode -> process.
    owners: HashMap<u64, (u32, String)>,
}

impl SocketTable {
    fn read() -> SocketTable {
        let mut t = SocketTable::default();
        for (file, proto) in [
            ("tcp", "tcp"),
            ("tcp6", "tcp"),
            ("udp", "udp"),
            ("udp6", "udp"),
        ] {
            let Ok(text) = std::fs::read_to_string(format!("/proc/net/{file}")) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let cols: Vec<&str> = line.split_whitespace().collect();
                let (Some(local), Some(state), Some(inode)) =
                    (cols.get(1), cols.get(3), cols.get(9))
                else {
                    continue;
                };
                // TCP: listening sockets only (state 0A); UDP: every bound socket.
                if proto == "tcp" && *state != "0A" {
                    continue;
                }
                let port = local
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok());
                if let (Some(port), Ok(inode)) = (port, inode.parse::<u64>()) {
                    if inode != 0 {
                        t.inodes.entry((proto, port)).or_default().push(inode);
                    }
                }
            }
        }
        if t.inodes.is_empty() {
            return t;
        }
        let wanted: std::collections::HashSet<u64> = t.inodes.values().flatten().copied().collect();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return t;
        };
        for p in procs.flatten() {
            let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                let Ok(link) = std::fs::read_link(fd.path()) else {
                    continue;
                };
                let link = link.to_string_lossy();
                let Some(inode) = link
                    .strip_prefix("socket:[")
                    .and_then(|s| s.strip_suffix(']'))
                    .and_then(|s| s.parse::<u64>().ok())
                else {
                    continue;
                };
                if wanted.contains(&inode) {
                    let name = std::fs::read_to_string(p.path().join("comm"))
                        .map(|c| c.trim().to_string())
                        .unwrap_or_else(|_| "?".into());
                    t.owners.insert(inode, (pid, name));
                }
            }
        }
        t
    }

    /// The process holding `port` of `proto`, when it can be found.
    fn holder(&self, proto: Proto, port: u16) -> Option<Holder> {
        self.inodes
            .get(&(proto.as_str(), port))?
            .iter()
            .find_map(|i| self.owners.get(i))
            .map(|(pid, name)| Holder {
                pid: *pid,
                name: name.clone(),
            })
    }
}

/// Linux capability numbers (`linux/capability.h`).
const CAP_NET_BIND_SERVICE: u32 = 10;
const CAP_NET_RAW: u32 = 13;

/// The effective capabilities of this process (`CapEff` of `/proc/self/status`).
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// The effective user id of this process (`Uid` of `/proc/self/status`: real, effective, ...).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// The capabilities the settings need: `CAP_NET_BIND_SERVICE` for a port below the kernel's
/// unprivileged start (usually 1024), `CAP_NET_RAW` to bind DHCP to named interfaces.
fn capabilities(r: &mut Report, config: &Config) {
    let unprivileged: u16 =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1024);
    let low: Vec<String> = ports(config)
        .iter()
        .filter(|p| p.addr.port() != 0 && p.addr.port() < unprivileged)
        .map(|p| format!("{} {}", p.what, p.addr.port()))
        .collect();
    let by_device = config
        .dhcp
        .as_ref()
        .is_some_and(|d| !d.interfaces.is_empty());
    let caps = effective_caps();
    let has = |cap: u32| caps.is_some_and(|c| c & (1u64 << cap) != 0);
    let mut need: Vec<String> = Vec::new();
    let mut missing: Vec<&str> = Vec::new();
    if !low.is_empty() {
        need.push(format!(
            "CAP_NET_BIND_SERVICE for {} (below {unprivileged})",
            low.join(", ")
        ));
        if !has(CAP_NET_BIND_SERVICE) {
            missing.push("cap_net_bind_service");
        }
    }
    if by_device {
        need.push("CAP_NET_RAW to bind DHCP to dhcp.interfaces".into());
        if !has(CAP_NET_RAW) {
            missing.push("cap_net_raw");
        }
    }
    let uid = effective_uid().map_or_else(|| "?".to_string(), |u| u.to_string());
    if need.is_empty() {
        r.ok(
            "capabilities",
            format!("none needed: no port below {unprivileged} and no dhcp.interfaces"),
        );
    } else if missing.is_empty() {
        r.ok(
            "capabilities",
            format!(
                "this process (uid {uid}) has what the settings need: {}",
                need.join("; ")
            ),
        );
    } else {
        r.fail(
            "capabilities",
            format!(
                "this process (uid {uid}) lacks {}; needed: {}",
                missing.join(" and "),
                need.join("; ")
            ),
            format!(
                "run as root, or `setcap {}=+ep $(command -v plinth)` (systemd: AmbientCapabilities={})",
                missing.join(","),
                missing
                    .iter()
                    .map(|c| c.to_ascii_uppercase())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        );
    }
}

/// The iPXE binary of each firmware Plinth hands one to.
fn ipxe(r: &mut Report, config: &Config) {
    let dir = &config.ipxe_dir;
    let boots = config.dhcp.is_some() || config.tftp.is_some();
    let fetch = format!(
        "`ipxe/fetch.sh {}` after `apt-get install ipxe` (or `ipxe/fetch.sh --debian trixie {}`), or set boot.ipxe_dir",
        shown(dir),
        shown(dir)
    );
    if !dir.is_dir() {
        let detail = format!("{} is not a directory", shown(dir));
        if boots {
            r.fail("iPXE binaries (boot.ipxe_dir)", detail, fetch);
        } else {
            r.warn(
                "iPXE binaries (boot.ipxe_dir)",
                format!("{detail}; DHCP and TFTP are off, so only machines sent to /ipxe/ by other means need them"),
                fetch,
            );
        }
        return;
    }
    let files = BootFiles::new(Some(dir.clone()));
    for b in IPXE_BINARIES.iter().filter(|b| b.chosen_for.is_some()) {
        let check = format!("iPXE for {} ({})", b.boots, b.file);
        // Machines of other architectures than x86_64 are rarer: a missing ARM64 binary warns.
        let needed = boots
            && matches!(
                b.chosen_for,
                Some(Firmware::Bios | Firmware::Uefi(crate::domain::dhcp::Arch::Amd64))
            );
        let missing = |r: &mut Report, detail: String| {
            if needed {
                r.fail(check.clone(), detail, fetch.clone());
            } else {
                r.warn(check.clone(), detail, fetch.clone());
            }
        };
        match files.resolve(b.file) {
            Ok(path) => match std::fs::metadata(&path) {
                Ok(m) if m.len() > 0 => {
                    r.ok(check.clone(), format!("{} ({} bytes)", shown(&path), m.len()))
                }
                _ => missing(r, format!("{} is empty", shown(&path))),
            },
            Err(FileRefusal::Denied) => missing(
                r,
                format!(
                    "{} is a link out of the directory, which Plinth does not follow: copy the file instead",
                    shown(&dir.join(b.file))
                ),
            ),
            Err(_) => missing(r, format!("no {} in {}", b.file, shown(dir))),
        }
    }
}

/// The database: reachable and migrated. Returns it open when its tables are there.
async fn database(r: &mut Report, config: &Config) -> Option<Stores> {
    let url = crate::store::redact_url(&config.database_url);
    if let Some(f) = sqlite_file(&config.database_url) {
        if !f.exists() {
            r.warn(
                "database",
                format!("no SQLite database yet at {}", shown(&f)),
                "`plinth migrate` (or the first `plinth serve`) creates it; if the server keeps it elsewhere, point doctor there with --config, --data-dir or --database-url",
            );
            return None;
        }
    }
    let stores = match crate::app::open_store_in_place(config, false).await {
        Ok(s) => s,
        Err(e) => {
            r.fail(
                "database",
                format!("cannot open {url}: {e:#}"),
                "check database.url (or PLINTH_DATABASE_URL): is PostgreSQL running there, and may this user connect?",
            );
            return None;
        }
    };
    if let Err(e) = stores.health.ping().await {
        r.fail(
            "database",
            format!("{url} does not answer: {e}"),
            "check that the database server is up and reachable",
        );
        return None;
    }
    match stores.health.migration_gap().await {
        Err(e) => {
            r.fail(
                "database",
                format!("{url}: cannot read its migrations: {e}"),
                "check the database user's rights",
            );
            None
        }
        Ok(g) if !g.unknown.is_empty() => {
            r.fail(
                "database",
                format!(
                    "{url} was migrated by a newer Plinth (migrations {:?} are unknown to this binary)",
                    g.unknown
                ),
                "run the Plinth release that migrated it (or newer)",
            );
            None
        }
        Ok(g) if g.pending.len() == g.known => {
            r.warn(
                "database",
                format!(
                    "{url} is reachable but not migrated ({} migrations pending)",
                    g.known
                ),
                "`plinth migrate` (the first `plinth serve` migrates too)",
            );
            None
        }
        Ok(g) if !g.pending.is_empty() => {
            r.warn(
                "database",
                format!(
                    "{url} is reachable; {} migration(s) pending: {}",
                    g.pending.len(),
                    g.pending.join(", ")
                ),
                "`plinth migrate` (or restart `plinth serve`, which migrates on start)",
            );
            Some(stores)
        }
        Ok(g) => {
            r.ok(
                "database",
                format!("{url} is reachable and migrated ({} migrations)", g.known),
            );
            Some(stores)
        }
    }
}

/// The secret key: present, private, and the one the database's secrets are sealed with. Returns
/// whether it opens the database's secrets.
async fn secret_key(r: &mut Report, config: &Config, stores: Option<&Stores>) -> bool {
    let source = match config.require_secret_key() {
        Ok(s) => s.clone(),
        Err(e) => {
            r.fail(
                "secret key",
                e.message.clone(),
                "`plinth secret-key > /etc/plinth/secret.key && chmod 600 /etc/plinth/secret.key`, then set secrets.key_file (or PLINTH_SECRET_KEY)",
            );
            return false;
        }
    };
    let from = match &source {
        SecretKeySource::Env => "PLINTH_SECRET_KEY".to_string(),
        SecretKeySource::File(p) => format!("secrets.key_file {}", shown(p)),
        SecretKeySource::DataDir(p) => shown(p),
    };
    let restore =
        "restore the key file from your backup (a new key cannot open the secrets already stored)";
    if let SecretKeySource::DataDir(p) = &source {
        if !p.exists() {
            let sealed = match stores {
                Some(s) => {
                    s.health.key_fingerprint().await.ok().flatten().is_some()
                        || s.health.holds_sealed_values().await.unwrap_or(false)
                }
                None => false,
            };
            if sealed {
                r.fail(
                    "secret key",
                    format!("no key at {from}, but the database holds secrets sealed with one"),
                    restore,
                );
            } else {
                r.warn(
                    "secret key",
                    format!("no key yet at {from}"),
                    "the first `plinth serve` creates it (mode 0600): back it up then",
                );
            }
            return false;
        }
    }
    let checked = match stores {
        Some(s) => crate::app::checked_secret_box(config, s, false).await,
        None => crate::app::secret_box(config),
    };
    match checked {
        Ok(_) if stores.is_some() => {
            r.ok(
                "secret key",
                format!("{from}: private, and the key the database's secrets are sealed with (or none are yet)"),
            );
            true
        }
        Ok(_) => {
            r.ok("secret key", format!("{from}: present and private"));
            false
        }
        Err(e) => {
            let text = format!("{e:#}");
            let fix = if text.contains("chmod") {
                "`chmod 600` the key file (the message names it)".to_string()
            } else if text.contains("not the key") {
                restore.to_string()
            } else {
                "see the message; `plinth secret-key` prints a new key for a new installation"
                    .to_string()
            };
            r.fail("secret key", text, fix);
            false
        }
    }
}

/// Kernel and initramfs of every declared cluster's Talos version and schematic.
async fn images(r: &mut Report, config: &Config, stores: &Stores) {
    let clusters = match stores.configs.clusters().await {
        Ok(c) => c,
        Err(e) => {
            r.fail(
                "Talos images",
                format!("cannot read the declared clusters: {e}"),
                "check the database",
            );
            return;
        }
    };
    if clusters.is_empty() {
        r.ok(
            "Talos images",
            "no cluster declared yet (`plinth apply DIR` declares them)",
        );
        return;
    }
    let cache = crate::images::ImageCache::new(config.data_dir.join("images"));
    let arch = crate::domain::dhcp::Arch::Amd64;
    for c in clusters {
        let (schematic, version) = (&c.spec.schematic_id, &c.spec.talos_version);
        let check = format!(
            "Talos image of cluster {} ({version}, amd64, schematic {}…)",
            c.spec.name,
            schematic.get(..12).unwrap_or(schematic)
        );
        let missing: Vec<String> = [
            crate::images::kernel_name(arch),
            crate::images::initramfs_name(arch),
        ]
        .into_iter()
        .filter(|f| !matches!(cache.path(schematic, version, f), Ok(Some(_))))
        .collect();
        let pull = format!(
            "`{}`",
            crate::service::provisioning::pull_command(schematic, version, arch)
        );
        if missing.is_empty() {
            r.ok(
                check,
                format!(
                    "kernel and initramfs cached in {}",
                    shown(&config.data_dir.join("images"))
                ),
            );
        } else if let Some(f) = &config.image_factory {
            r.warn(
                check,
                format!("{} not cached; pulled from {f} when the first machine boots (it waits meanwhile)", missing.join(" and ")),
                pull,
            );
        } else {
            r.fail(
                check,
                format!(
                    "{} not cached and no Image Factory is configured ([images] factory_url): its machines wait at boot",
                    missing.join(" and ")
                ),
                pull,
            );
        }
    }
}

/// Each BMC of the inventory: its service root over its TLS mode (no credentials), then, when
/// the secret key opens its stored password, a read that needs them (the power state).
async fn bmcs(
    r: &mut Report,
    config: &Config,
    stores: &Stores,
    key_ok: bool,
    timeout: std::time::Duration,
) {
    let machines = match stores
        .machines
        .all_machines(&MachineFilter {
            limit: 500,
            ..Default::default()
        })
        .await
    {
        Ok(m) => m,
        Err(e) => {
            r.fail(
                "BMCs",
                format!("cannot list the machines: {e}"),
                "check the database",
            );
            return;
        }
    };
    let with_bmc: Vec<_> = machines.into_iter().filter(|m| m.bmc.is_some()).collect();
    if with_bmc.is_empty() {
        r.ok("BMCs", "no machine has a BMC on record");
        return;
    }
    let inventory = if key_ok {
        crate::app::secret_box(config)
            .ok()
            .map(|sb| crate::app::inventory(stores, sb))
    } else {
        None
    };
    let connector: Arc<dyn crate::service::BmcConnector> =
        crate::app::bmc_connector_for_checks(timeout);
    let results: Vec<Check> = futures::stream::iter(with_bmc)
        .map(|m| {
            let connector = connector.clone();
            let inventory = inventory.clone();
            async move { bmc(&m, connector.as_ref(), inventory.as_ref()).await }
        })
        .buffered(16)
        .collect()
        .await;
    r.checks.extend(results);
}

/// One BMC.
async fn bmc(
    m: &crate::domain::Machine,
    connector: &dyn crate::service::BmcConnector,
    inventory: Option<&crate::service::Inventory>,
) -> Check {
    let name = m.display_name();
    let Some(b) = &m.bmc else {
        return Check {
            status: Status::Ok,
            check: format!("BMC of {name}"),
            detail: "none".into(),
            fix: None,
        };
    };
    let check = format!("BMC of {name} ({}, tls {})", b.url, b.tls.as_str());
    let fail = |detail: String, fix: String| Check {
        status: Status::Fail,
        check: check.clone(),
        detail,
        fix: Some(fix),
    };
    let password = match (inventory, b.has_password) {
        (Some(inv), true) => match inv.bmc_password(m).await {
            Ok(p) => p,
            Err(e) => {
                return fail(
                    format!("{e}"),
                    format!("`plinth machine edit {name} --set bmc.password=...`"),
                )
            }
        },
        _ => None,
    };
    let client = match connector.connect(b, password.as_deref().unwrap_or("")) {
        Ok(c) => c,
        Err(e) => {
            return fail(
                e.to_string(),
                format!("fix bmc.url / bmc.tls / bmc.fingerprint: `plinth machine edit {name} --set bmc.tls=...`"),
            )
        }
    };
    let root = match client.service_root().await {
        Ok(root) => root,
        Err(e) => {
            let text = e.to_string();
            let tls = text.contains("certificate") || text.contains("TLS") || text.contains("tls");
            let fix = if tls {
                format!("pin the BMC's certificate: `plinth machine edit {name} --set bmc.tls=pinned --set bmc.fingerprint=SHA256` (`openssl s_client -connect HOST:PORT </dev/null | openssl x509 -noout -fingerprint -sha256` prints it)")
            } else {
                format!("check that the BMC is powered and on the management network, and its URL (`plinth machine edit {name} --set bmc.url=https://ADDRESS`)")
            };
            let _ = client.close().await;
            return fail(format!("does not answer over its TLS mode: {text}"), fix);
        }
    };
    let about = [
        root.vendor.clone(),
        root.product.clone(),
        root.redfish_version
            .as_ref()
            .map(|v| format!("Redfish {v}")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ");
    let about = if about.is_empty() {
        "Redfish".to_string()
    } else {
        about
    };
    let out = match (&password, b.has_password, inventory.is_some()) {
        (Some(_), _, _) => match client.power_state().await {
            Ok(p) => Check {
                status: Status::Ok,
                check: check.clone(),
                detail: format!("answers ({about}); credentials accepted, power {p:?}"),
                fix: None,
            },
            Err(crate::service::ports::bmc::BmcError::Unauthorized(e)) => fail(
                format!("answers ({about}) but refuses the stored credentials: {e}"),
                format!("`plinth machine edit {name} --set bmc.username=USER --set bmc.password=...`"),
            ),
            Err(e) => fail(
                format!("answers ({about}) but reading the power state failed: {e}"),
                format!("`plinth bmc probe {name}` shows what the BMC supports"),
            ),
        },
        (None, false, _) => Check {
            status: Status::Warn,
            check: check.clone(),
            detail: format!("answers ({about}); no password on record, so power and boot actions will be refused"),
            fix: Some(format!("`plinth machine edit {name} --set bmc.password=...`")),
        },
        (None, true, _) => Check {
            status: Status::Warn,
            check: check.clone(),
            detail: format!("answers ({about}); credentials not checked: the secret key does not open the stored password"),
            fix: Some("fix the secret key check above".into()),
        },
    };
    let _ = client.close().await;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_print_lower_case() {
        for s in [Status::Ok, Status::Warn, Status::Fail] {
            assert_eq!(serde_json::to_value(s).expect("json"), json!(s.as_str()));
        }
    }

    #[test]
    fn a_failed_check_fails_the_run() {
        let mut r = Report::default();
        r.ok("a", "fine");
        assert!(Report {
            checks: r.checks.clone()
        }
        .finish(true)
        .is_ok());
        r.fail("b", "broken", "fix it");
        assert!(r.finish(true).is_err());
    }

    #[test]
    fn a_port_of_this_process_is_found_in_the_socket_table() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let t = SocketTable::read();
        let h = t.holder(Proto::Tcp, port).expect("this process holds it");
        assert_eq!(h.pid, std::process::id());
    }
}

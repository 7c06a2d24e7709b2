//! Configuration: `RawConfig` mirrors the TOML file (unknown keys refused), `Config` is the validated
//! form the server runs on. Every refusal names the key and the fix, and happens before any socket
//! is bound. Secrets never live in this file: the secret key comes from `PLINTH_SECRET_KEY` or a
//! key file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::domain::database::{redact_url, Dialect};

/// Default data directory, relative to where the server starts.
pub const DEFAULT_DATA_DIR: &str = "./plinth-data";
/// Default HTTP listen address.
pub const DEFAULT_HTTP: &str = "0.0.0.0:8080";
/// Environment variable that holds the secret key (takes precedence over `secrets.key_file`).
pub const SECRET_KEY_ENV: &str = "PLINTH_SECRET_KEY";
/// Environment variable naming the settings file when `--config` does not.
pub const CONFIG_ENV: &str = "PLINTH_CONFIG";
/// Environment variable standing for `--database-url`.
pub const DATABASE_URL_ENV: &str = "PLINTH_DATABASE_URL";
/// The system-wide settings file, read when neither `--config` nor `PLINTH_CONFIG` names one and
/// it exists.
pub const SYSTEM_CONFIG: &str = "/etc/plinth/plinth.toml";

/// The value of an environment variable; unset, empty and non-UTF-8 values all count as unset
/// (a container image's `ENV PLINTH_CONFIG=""` means "no file", not "a file named ''").
pub fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where the settings come from: the first of `--config`, `PLINTH_CONFIG`, and the system file
/// `/etc/plinth/plinth.toml` when it exists; else none, and the embedded defaults apply (the
/// data directory `./plinth-data`). Every command that reads the settings finds them this way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingsFile {
    /// `--config FILE`.
    Flag(PathBuf),
    /// `PLINTH_CONFIG=FILE`.
    Env(PathBuf),
    /// The system file, which exists.
    System(PathBuf),
    /// No file: the embedded defaults.
    Defaults,
}

impl SettingsFile {
    /// Locate the settings from `--config`, the environment and the system file.
    pub fn locate(flag: Option<&Path>) -> SettingsFile {
        Self::locate_with(flag, env_value(CONFIG_ENV), Path::new(SYSTEM_CONFIG))
    }

    /// `locate` with the environment's value and the system file given.
    pub fn locate_with(flag: Option<&Path>, env: Option<String>, system: &Path) -> SettingsFile {
        if let Some(f) = flag.filter(|f| !f.as_os_str().is_empty()) {
            SettingsFile::Flag(f.to_path_buf())
        } else if let Some(e) = env {
            SettingsFile::Env(PathBuf::from(e))
        } else if system.exists() {
            SettingsFile::System(system.to_path_buf())
        } else {
            SettingsFile::Defaults
        }
    }

    /// The file, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            SettingsFile::Flag(p) | SettingsFile::Env(p) | SettingsFile::System(p) => Some(p),
            SettingsFile::Defaults => None,
        }
    }
}

impl std::fmt::Display for SettingsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettingsFile::Flag(p) => write!(f, "--config {}", p.display()),
            SettingsFile::Env(p) => write!(f, "{CONFIG_ENV}={}", p.display()),
            SettingsFile::System(p) => write!(f, "{} (the system default)", p.display()),
            SettingsFile::Defaults => write!(
                f,
                "the embedded defaults (no --config, {CONFIG_ENV} or {SYSTEM_CONFIG})"
            ),
        }
    }
}

/// A refused setting: a bad key or value of the TOML settings file, an override flag, or the
/// environment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config key `{key}`: {message}")]
pub struct SettingsError {
    /// Dotted key, e.g. `http.listen`.
    pub key: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl SettingsError {
    fn new(key: &str, message: impl Into<String>) -> Self {
        Self {
            key: key.to_string(),
            message: message.into(),
        }
    }
}

/// The TOML file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Directory for the SQLite database, the generated secret key and caches.
    pub data_dir: Option<PathBuf>,
    /// `[database]`.
    #[serde(default)]
    pub database: RawDatabase,
    /// `[http]`.
    #[serde(default)]
    pub http: RawHttp,
    /// `[secrets]`.
    #[serde(default)]
    pub secrets: RawSecrets,
    /// `[log]`.
    #[serde(default)]
    pub log: RawLog,
    /// `[dhcp]`.
    #[serde(default)]
    pub dhcp: RawDhcp,
    /// `[boot]`.
    #[serde(default)]
    pub boot: RawBoot,
    /// `[tftp]`.
    #[serde(default)]
    pub tftp: RawTftp,
    /// `[talos]`.
    #[serde(default)]
    pub talos: RawTalos,
    /// `[workflows]`.
    #[serde(default)]
    pub workflows: RawWorkflows,
    /// `[images]`.
    #[serde(default)]
    pub images: RawImages,
    /// `[upgrades]`.
    #[serde(default)]
    pub upgrades: RawUpgrades,
    /// `[snapshots]`.
    #[serde(default)]
    pub snapshots: RawSnapshots,
}

/// `[upgrades]`: the pace of rolling Talos upgrades.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpgrades {
    /// How often rollouts are moved on and nodes asked, seconds (default 2).
    pub poll_seconds: Option<u64>,
    /// How long an instance's hold on a rollout lasts without renewal, seconds (default 30):
    /// how soon another instance (or this one restarted) takes over a rollout whose driver died.
    pub lease_seconds: Option<u64>,
    /// Longest image pull, and longest install, on one node, seconds (default 900).
    pub install_wait_seconds: Option<u64>,
}

/// `[snapshots]`: the etcd snapshot schedule's pace and S3-compatible stores' settings. Which
/// clusters are snapshotted, how often, how many are kept and where is each cluster's
/// `etcdSnapshots` in the inventory; credentials are never there (nor here: a file, or the
/// environment's `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSnapshots {
    /// How often the schedule looks for due snapshots, seconds (default 60).
    pub tick_seconds: Option<u64>,
    /// How long an instance's turn to take a cluster's snapshot lasts without renewal, seconds
    /// (default 60; renewed every third of it while the snapshot streams): how soon another
    /// instance (or this one restarted) may take a snapshot after the holder died.
    pub turn_seconds: Option<u64>,
    /// S3 endpoint URL (default: `AWS_ENDPOINT`, else AWS).
    pub s3_endpoint: Option<String>,
    /// S3 region (default: `AWS_REGION`, else `us-east-1`).
    pub s3_region: Option<String>,
    /// Allow an `http://` endpoint (default false).
    pub s3_allow_http: Option<bool>,
    /// A TOML file (mode 0600, outside Git) with `access_key_id` and `secret_access_key`.
    pub s3_credentials_file: Option<PathBuf>,
}

/// `[images]`: where Talos kernels and initramfs images come from.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImages {
    /// Image Factory base URL. When set, images a booting machine needs and the cache lacks are
    /// downloaded on demand (one download per file however many machines ask).
    pub factory_url: Option<String>,
}

/// `[workflows]`: deadlines of the reinstall stages and the engine's pace.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorkflows {
    /// How often running reinstalls are moved on and failed machines considered, seconds.
    pub tick_seconds: Option<u64>,
    /// Deadline of stage `power` (one-time boot and power cycle), seconds.
    pub power_seconds: Option<u64>,
    /// Deadline of stage `netboot` (install script fetched), seconds.
    pub netboot_seconds: Option<u64>,
    /// Deadline of stage `config` (config fetched), seconds.
    pub config_seconds: Option<u64>,
    /// Deadline of stage `talos_api` (Talos API answering), seconds.
    pub talos_api_seconds: Option<u64>,
    /// Port of the Talos API checked to confirm an install.
    pub talos_api_port: Option<u16>,
    /// How often each cluster's health is measured through the Talos API, seconds.
    pub health_seconds: Option<u64>,
    /// How long a reinstall's provisioning window stays open, seconds.
    pub window_seconds: Option<u64>,
    /// One-time boot target set through the BMC: `pxe` or `http` (UEFI HTTP boot).
    pub boot_target: Option<String>,
}

/// `[talos]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTalos {
    /// Directory of Talos JSON schemas, `config.schema.v<major>.<minor>.<patch>.json` (the file
    /// `pkg/machinery/config/schemas/config.schema.json` of each Talos release). Every rendered
    /// config is checked against the schema of its target version; the schemas of the supported
    /// releases ship in the binary, and a file here only adds a release or overrides one.
    pub schema_dir: Option<PathBuf>,
}

/// `[boot]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBoot {
    /// How booting machines reach Plinth's HTTP front door, e.g. `http://10.0.0.1:8080`.
    pub public_url: Option<String>,
    /// Directory with the iPXE binaries (`undionly.kpxe`, `ipxe.efi`, `snponly.efi`, `ipxe-arm64.efi`);
    /// default `<data_dir>/ipxe`, filled by `ipxe/fetch.sh`.
    pub ipxe_dir: Option<PathBuf>,
    /// `IP:PORT` of the image door, a second HTTP listener that serves `/images/` with sendfile;
    /// when set, install plans fetch kernel and initramfs from it. Off by default.
    pub images_listen: Option<String>,
    /// How booting machines reach the image door, e.g. `http://10.0.0.1:8081`; default: the host
    /// of `public_url` (or of each request) with the port of `images_listen`.
    pub images_url: Option<String>,
}

/// `[tftp]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTftp {
    /// Serve TFTP.
    pub enabled: Option<bool>,
    /// `IP:PORT` (default `0.0.0.0:69`).
    pub listen: Option<String>,
    /// Largest block size granted (RFC 2348), 512-65464.
    pub max_block_size: Option<u16>,
    /// Largest window granted (RFC 7440), 1-64.
    pub max_window_size: Option<u16>,
}

/// `[dhcp]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDhcp {
    /// Serve DHCP at all.
    pub enabled: Option<bool>,
    /// UDP port (67).
    pub port: Option<u16>,
    /// proxyDHCP port (4011); 0 turns it off.
    pub proxy_port: Option<u16>,
    /// Interfaces to serve on (one socket each); empty: every interface.
    pub interfaces: Option<Vec<String>>,
    /// Base URL of Plinth's HTTP front door as booting machines reach it.
    pub boot_url: Option<String>,
    /// How long an offer holds its address, seconds.
    pub offer_seconds: Option<u32>,
    /// How long a declined address stays quarantined, seconds.
    pub decline_quarantine_seconds: Option<u32>,
    /// Requests per second from clients the inventory does not know, per interface or relay
    /// (default 2000; 0: no limit). Known machines are never held back by it.
    pub unknown_clients_per_second: Option<u32>,
    /// `[[dhcp.subnet]]` tables.
    #[serde(default)]
    pub subnet: Vec<RawSubnet>,
}

/// `[[dhcp.subnet]]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSubnet {
    /// Network, e.g. `10.0.0.0/24`.
    pub cidr: Option<String>,
    /// `authoritative`, `proxy` or `off`.
    pub mode: Option<String>,
    /// Plinth's own address as this subnet's clients reach it: on the subnet, or (behind a
    /// relay) the address the relay forwards to.
    pub server_ip: Option<String>,
    /// Dynamic ranges `FIRST-LAST`.
    #[serde(default)]
    pub pool: Vec<String>,
    /// Option 3.
    #[serde(default)]
    pub routers: Vec<String>,
    /// Option 6.
    #[serde(default)]
    pub dns: Vec<String>,
    /// Option 42.
    #[serde(default)]
    pub ntp: Vec<String>,
    /// Option 15.
    pub domain: Option<String>,
    /// Option 51.
    pub lease_seconds: Option<u32>,
    /// Relay agents that forward this subnet's requests (their addresses as UDP sources);
    /// relayed requests from anywhere else are not answered.
    #[serde(default)]
    pub relay_agents: Vec<String>,
    /// Share of the pool that clients the inventory does not know may hold at once (0-1,
    /// default 0.5): a flood of made-up MACs leaves the rest to known machines.
    pub unknown_share: Option<f64>,
    /// Addresses one relay circuit (a switch port, option 82) may hold at once (default 4).
    pub leases_per_circuit: Option<u32>,
    /// Send IPv6 router advertisements (router lifetime 0, no prefix) on this subnet's link, so
    /// that iPXE's IPv6 autoconfiguration finishes at once (default false).
    pub ipv6_ra: Option<bool>,
    /// Prefixes (/64) those advertisements offer for address autoconfiguration (default none).
    #[serde(default)]
    pub ipv6_ra_prefixes: Vec<String>,
}

/// `[database]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDatabase {
    /// `sqlite://PATH` or `postgres://USER@HOST/DB`.
    pub url: Option<String>,
    /// Connection pool size.
    pub max_connections: Option<u32>,
}

/// `[http]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    /// `IP:PORT` to listen on.
    pub listen: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: Option<u64>,
}

/// `[secrets]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSecrets {
    /// File holding the 32-byte secret key (base64 or hex).
    pub key_file: Option<PathBuf>,
}

/// `[log]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    /// `text` or `json`.
    pub format: Option<String>,
    /// A tracing filter such as `info` or `plinth=debug,info`.
    pub level: Option<String>,
}

/// Values given on the command line; they win over the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--http`.
    pub http: Option<String>,
    /// `--database-url`.
    pub database_url: Option<String>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// Where the secret key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretKeySource {
    /// The `PLINTH_SECRET_KEY` variable.
    Env,
    /// A file given in the config.
    File(PathBuf),
    /// `<data_dir>/secret.key`, created on first start (embedded SQLite only).
    DataDir(PathBuf),
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Data directory.
    pub data_dir: PathBuf,
    /// Database URL.
    pub database_url: String,
    /// Which database.
    pub dialect: Dialect,
    /// Pool size.
    pub max_connections: u32,
    /// HTTP listen address.
    pub http_listen: SocketAddr,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Secret key source; `None` with a PostgreSQL database and no key configured, which only
    /// commands that need no key accept (`migrate`, `token`): see `require_secret_key`.
    pub secret_key: Option<SecretKeySource>,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log_level: String,
    /// DHCP, when enabled.
    pub dhcp: Option<DhcpConfig>,
    /// Boot URL (`[boot].public_url`).
    pub boot_public_url: Option<String>,
    /// iPXE binaries directory.
    pub ipxe_dir: PathBuf,
    /// The image door's listen address (`[boot].images_listen`), when on.
    pub images_listen: Option<SocketAddr>,
    /// The image door's URL for booting machines (`[boot].images_url`).
    pub images_url: Option<String>,
    /// TFTP, when enabled.
    pub tftp: Option<TftpConfig>,
    /// Talos JSON schemas (`[talos].schema_dir`).
    pub talos_schema_dir: Option<PathBuf>,
    /// Reinstall workflows.
    pub workflows: crate::service::WorkflowSettings,
    /// How often the workflow engine runs.
    pub workflow_tick: std::time::Duration,
    /// Rolling upgrades (`[upgrades]`).
    pub upgrades: crate::service::UpgradeSettings,
    /// Image Factory for on-demand pulls (`[images].factory_url`).
    pub image_factory: Option<String>,
    /// S3-compatible snapshot stores (`[snapshots]`).
    pub snapshot_s3: crate::service::ports::snapshots::S3Settings,
    /// How often the snapshot schedule runs (`[snapshots].tick_seconds`).
    pub snapshot_tick: std::time::Duration,
    /// The snapshot turn's length without renewal (`[snapshots].turn_seconds`).
    pub snapshot_turn: chrono::Duration,
}

/// Validated `[tftp]`.
#[derive(Debug, Clone)]
pub struct TftpConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Largest block size.
    pub max_block_size: u16,
    /// Largest window.
    pub max_window_size: u16,
}

/// Validated `[dhcp]`.
#[derive(Debug, Clone)]
pub struct DhcpConfig {
    /// UDP port.
    pub port: u16,
    /// proxyDHCP port, if on.
    pub proxy_port: Option<u16>,
    /// Interfaces (empty: all).
    pub interfaces: Vec<String>,
    /// HTTP base for boot files and scripts.
    pub boot_url: String,
    /// Offer hold time.
    pub offer_seconds: u32,
    /// Decline quarantine.
    pub decline_seconds: u32,
    /// Requests per second of unknown clients per interface or relay (0: no limit).
    pub unknown_clients_per_second: u32,
    /// Subnets.
    pub subnets: Vec<crate::domain::dhcp::Subnet>,
}

fn ipv4(key: &str, v: &str) -> Result<std::net::Ipv4Addr, SettingsError> {
    v.trim()
        .parse()
        .map_err(|_| SettingsError::new(key, format!("`{v}` is not an IPv4 address")))
}

/// A subnet's `ipv6_ra` and `ipv6_ra_prefixes`.
fn router_advert(
    k: &dyn Fn(&str) -> String,
    on: Option<bool>,
    prefixes: &[String],
    mode: crate::domain::dhcp::SubnetMode,
) -> Result<Option<crate::domain::dhcp::RouterAdvert>, SettingsError> {
    if !on.unwrap_or(false) {
        if !prefixes.is_empty() {
            return Err(SettingsError::new(
                &k("ipv6_ra_prefixes"),
                "advertised only with ipv6_ra = true: set it, or remove the prefixes",
            ));
        }
        return Ok(None);
    }
    if mode == crate::domain::dhcp::SubnetMode::Off {
        return Err(SettingsError::new(
            &k("ipv6_ra"),
            "a subnet with mode = \"off\" is not served: router advertisements need a served link",
        ));
    }
    let mut out = Vec::new();
    for p in prefixes {
        let net: ipnet::Ipv6Net = p.trim().parse().map_err(|_| {
            SettingsError::new(
                &k("ipv6_ra_prefixes"),
                format!("`{p}` is not an IPv6 prefix such as fd00:10::/64"),
            )
        })?;
        if net.prefix_len() != 64 {
            return Err(SettingsError::new(
                &k("ipv6_ra_prefixes"),
                format!("`{p}`: address autoconfiguration needs a /64 (RFC 4862 section 5.5.3)"),
            ));
        }
        out.push(net.trunc());
    }
    Ok(Some(crate::domain::dhcp::RouterAdvert { prefixes: out }))
}

impl RawDhcp {
    fn validate(self) -> Result<Option<DhcpConfig>, SettingsError> {
        use crate::domain::dhcp::{Ipv4Range, Subnet, SubnetMode};
        if !self.enabled.unwrap_or(false) {
            return Ok(None);
        }
        let boot_url = self.boot_url.ok_or_else(|| {
            SettingsError::new("dhcp.boot_url", "required with DHCP on: the http:// URL booting machines use to reach Plinth, e.g. http://10.0.0.1:8080")
        })?;
        if !(boot_url.starts_with("http://") || boot_url.starts_with("https://")) {
            return Err(SettingsError::new(
                "dhcp.boot_url",
                format!("`{boot_url}` must start with http:// (iPXE and UEFI fetch from it)"),
            ));
        }
        if self.subnet.is_empty() {
            return Err(SettingsError::new(
                "dhcp.subnet",
                "DHCP is on but no [[dhcp.subnet]] is configured",
            ));
        }
        let mut subnets: Vec<Subnet> = Vec::new();
        for (i, raw) in self.subnet.into_iter().enumerate() {
            let k = |f: &str| format!("dhcp.subnet[{i}].{f}");
            let cidr = raw
                .cidr
                .ok_or_else(|| SettingsError::new(&k("cidr"), "required, e.g. 10.0.0.0/24"))?;
            let net: ipnet::Ipv4Net = cidr.trim().parse().map_err(|_| {
                SettingsError::new(
                    &k("cidr"),
                    format!("`{cidr}` is not an IPv4 network such as 10.0.0.0/24"),
                )
            })?;
            let net = net.trunc();
            let mode = match raw.mode.as_deref().unwrap_or("authoritative") {
                "authoritative" => SubnetMode::Authoritative,
                "proxy" => SubnetMode::Proxy,
                "off" => SubnetMode::Off,
                other => {
                    return Err(SettingsError::new(
                        &k("mode"),
                        format!("`{other}` is not authoritative, proxy or off"),
                    ))
                }
            };
            let server_ip = ipv4(&k("server_ip"), raw.server_ip.as_deref().unwrap_or(""))?;
            // Option 54 and the address clients renew with: Plinth's own unicast address, on the
            // subnet itself or, for a subnet behind a relay (RFC 1542), the address the relay
            // forwards to, which is outside the relayed subnet.
            if server_ip.is_unspecified()
                || server_ip.is_broadcast()
                || server_ip.is_loopback()
                || server_ip.is_multicast()
                || server_ip == net.network()
                || (net.prefix_len() < 31 && server_ip == net.broadcast())
            {
                return Err(SettingsError::new(
                    &k("server_ip"),
                    format!("{server_ip} is not a unicast address Plinth can answer from: use its address on {net}, or for a subnet behind a relay the address the relay forwards to"),
                ));
            }
            let mut pool = Vec::new();
            for r in &raw.pool {
                let range: Ipv4Range = r
                    .parse()
                    .map_err(|e: String| SettingsError::new(&k("pool"), e))?;
                if !net.contains(&range.first)
                    || !net.contains(&range.last)
                    || range.contains(net.network())
                    || range.contains(net.broadcast())
                {
                    return Err(SettingsError::new(&k("pool"), format!("`{r}` must lie inside {net}, without its network and broadcast addresses")));
                }
                pool.push(range);
            }
            if mode == SubnetMode::Proxy && !pool.is_empty() {
                return Err(SettingsError::new(
                    &k("pool"),
                    "a proxy subnet hands out no addresses: remove the pool",
                ));
            }
            let list = |f: &str, v: &[String]| {
                v.iter()
                    .map(|x| ipv4(&k(f), x))
                    .collect::<Result<Vec<_>, _>>()
            };
            let lease_seconds = raw.lease_seconds.unwrap_or(3600);
            if lease_seconds < 60 {
                return Err(SettingsError::new(
                    &k("lease_seconds"),
                    "must be at least 60",
                ));
            }
            let s = Subnet {
                net,
                mode,
                server_ip,
                pool,
                routers: list("routers", &raw.routers)?,
                dns: list("dns", &raw.dns)?,
                ntp: list("ntp", &raw.ntp)?,
                domain: raw.domain,
                lease_seconds,
                relay_agents: list("relay_agents", &raw.relay_agents)?,
                unknown_permille: match raw.unknown_share {
                    None => 500,
                    Some(v) if (0.0..=1.0).contains(&v) => (v * 1000.0).round() as u16,
                    Some(_) => {
                        return Err(SettingsError::new(
                            &k("unknown_share"),
                            "must be between 0 and 1 (a share of the pool)",
                        ))
                    }
                },
                leases_per_circuit: match raw.leases_per_circuit {
                    None => 4,
                    Some(0) => {
                        return Err(SettingsError::new(
                            &k("leases_per_circuit"),
                            "must be at least 1",
                        ))
                    }
                    Some(n) => n,
                },
                router_advert: router_advert(&k, raw.ipv6_ra, &raw.ipv6_ra_prefixes, mode)?,
            };
            if let Some(o) = subnets
                .iter()
                .find(|o| o.net.contains(&s.net.network()) || s.net.contains(&o.net.network()))
            {
                return Err(SettingsError::new(
                    &k("cidr"),
                    format!("{} overlaps {}", s.net, o.net),
                ));
            }
            subnets.push(s);
        }
        let proxy_port = match self.proxy_port.unwrap_or(4011) {
            0 => None,
            p => Some(p),
        };
        Ok(Some(DhcpConfig {
            port: self.port.unwrap_or(67),
            proxy_port,
            interfaces: self.interfaces.unwrap_or_default(),
            boot_url,
            offer_seconds: self.offer_seconds.unwrap_or(60).max(5),
            decline_seconds: self.decline_quarantine_seconds.unwrap_or(3600),
            unknown_clients_per_second: self.unknown_clients_per_second.unwrap_or(2000),
            subnets,
        }))
    }
}

impl RawConfig {
    /// Parse TOML text; an unknown key or a wrong type names the key.
    pub fn parse(text: &str) -> Result<RawConfig, SettingsError> {
        let de = toml::Deserializer::new(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let msg = inner.message().to_string();
            let line = inner
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            let key = if key == "." || key.is_empty() {
                "-".to_string()
            } else {
                key
            };
            let fix = if msg.contains("unknown field") {
                "; remove it or fix its spelling (plinth.example.toml lists every key)"
            } else {
                ""
            };
            let at = line.map(|l| format!(" (line {l})")).unwrap_or_default();
            SettingsError::new(&key, format!("{msg}{at}{fix}"))
        })
    }

    /// Read and parse a file.
    pub fn load(path: &Path) -> Result<RawConfig, SettingsError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SettingsError::new("-", format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|mut e| {
            e.message = format!("{} in {}", e.message, path.display());
            e
        })
    }

    /// Apply overrides and validate.
    pub fn validate(self, o: &Overrides) -> Result<Config, SettingsError> {
        let data_dir = o
            .data_dir
            .clone()
            .or(self.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        if data_dir.as_os_str().is_empty() {
            return Err(SettingsError::new("data_dir", "must not be empty"));
        }
        let url = o
            .database_url
            .clone()
            .or(self.database.url)
            .unwrap_or_else(|| format!("sqlite://{}", data_dir.join("plinth.db").display()));
        let dialect = Dialect::of_url(&url).ok_or_else(|| {
            SettingsError::new(
                "database.url",
                format!(
                    "`{}` is not a database URL Plinth speaks; use sqlite://PATH or postgres://USER@HOST:PORT/DB",
                    redact_url(&url)
                ),
            )
        })?;
        let max_connections = self.database.max_connections.unwrap_or(8);
        if !(1..=512).contains(&max_connections) {
            return Err(SettingsError::new(
                "database.max_connections",
                "must be between 1 and 512",
            ));
        }
        let listen = o
            .http
            .clone()
            .or(self.http.listen)
            .unwrap_or_else(|| DEFAULT_HTTP.to_string());
        let http_listen = parse_addr(
            if o.http.is_some() {
                "--http"
            } else {
                "http.listen"
            },
            &listen,
        )?;
        let max_body = self.http.max_body_bytes.unwrap_or(32 * 1024 * 1024);
        if !(1024..=1024 * 1024 * 1024).contains(&max_body) {
            return Err(SettingsError::new(
                "http.max_body_bytes",
                "must be between 1024 and 1073741824 (1 GiB)",
            ));
        }
        let secret_key = if env_value(SECRET_KEY_ENV).is_some() {
            Some(SecretKeySource::Env)
        } else if let Some(f) = self.secrets.key_file {
            Some(SecretKeySource::File(f))
        } else if dialect == Dialect::Postgres {
            None
        } else {
            Some(SecretKeySource::DataDir(data_dir.join("secret.key")))
        };
        let log_format = match self.log.format.as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(SettingsError::new(
                    "log.format",
                    format!("`{other}` is not `text` or `json`"),
                ));
            }
        };
        let log_level = self.log.level.unwrap_or_else(|| "info".into());
        if tracing_subscriber::EnvFilter::try_new(&log_level).is_err() {
            return Err(SettingsError::new(
                "log.level",
                format!(
                    "`{log_level}` is not a log filter; use e.g. `info` or `plinth=debug,info`"
                ),
            ));
        }
        let boot_public_url = self
            .boot
            .public_url
            .map(|u| u.trim_end_matches('/').to_string());
        if let Some(u) = &boot_public_url {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(SettingsError::new(
                    "boot.public_url",
                    format!("`{u}` must start with http:// (iPXE fetches from it)"),
                ));
            }
        }
        let mut raw_dhcp = self.dhcp;
        if raw_dhcp.boot_url.is_none() {
            raw_dhcp.boot_url = boot_public_url.clone();
        }
        let dhcp = raw_dhcp.validate()?;
        let ipxe_dir = self.boot.ipxe_dir.unwrap_or_else(|| data_dir.join("ipxe"));
        let images_listen = match &self.boot.images_listen {
            Some(a) => Some(parse_addr("boot.images_listen", a)?),
            None => None,
        };
        if images_listen.is_some_and(|a| a.port() != 0 && a == http_listen) {
            return Err(SettingsError::new(
                "boot.images_listen",
                format!("`{http_listen}` is http.listen already; give the image door its own port, e.g. 8081"),
            ));
        }
        let images_url = self
            .boot
            .images_url
            .map(|u| u.trim_end_matches('/').to_string());
        match (&images_url, images_listen) {
            (Some(u), _) if !u.starts_with("http://") => {
                return Err(SettingsError::new(
                    "boot.images_url",
                    format!("`{u}` must start with http:// (the image door speaks plain HTTP)"),
                ));
            }
            (Some(_), None) => {
                return Err(SettingsError::new(
                    "boot.images_url",
                    "is the URL of the image door: set boot.images_listen too, or remove it",
                ));
            }
            _ => {}
        }
        let tftp = if self.tftp.enabled.unwrap_or(false) {
            let listen = parse_addr(
                "tftp.listen",
                self.tftp.listen.as_deref().unwrap_or("0.0.0.0:69"),
            )?;
            let max_block_size = self.tftp.max_block_size.unwrap_or(1468);
            if !(512..=65464).contains(&max_block_size) {
                return Err(SettingsError::new(
                    "tftp.max_block_size",
                    "must be between 512 and 65464 (RFC 2348)",
                ));
            }
            let max_window_size = self.tftp.max_window_size.unwrap_or(16);
            if !(1..=64).contains(&max_window_size) {
                return Err(SettingsError::new(
                    "tftp.max_window_size",
                    "must be between 1 and 64",
                ));
            }
            if !ipxe_dir.is_dir() {
                return Err(SettingsError::new(
                    "boot.ipxe_dir",
                    format!(
                        "{} is not a directory of iPXE binaries: run `ipxe/fetch.sh {}` (after `apt-get install ipxe`), or set boot.ipxe_dir",
                        ipxe_dir.display(),
                        ipxe_dir.display()
                    ),
                ));
            }
            Some(TftpConfig {
                listen,
                max_block_size,
                max_window_size,
            })
        } else {
            None
        };
        let talos_schema_dir = match self.talos.schema_dir {
            Some(d) if !d.is_dir() => {
                return Err(SettingsError::new(
                    "talos.schema_dir",
                    format!(
                        "{} is not a directory: point it at a directory of config.schema.v<version>.json files",
                        d.display()
                    ),
                ))
            }
            other => other,
        };
        let w = &self.workflows;
        let secs =
            |key: &str, v: Option<u64>, default: u64| -> Result<chrono::Duration, SettingsError> {
                let v = v.unwrap_or(default);
                if !(1..=604_800).contains(&v) {
                    return Err(SettingsError::new(
                        key,
                        "must be between 1 and 604800 seconds",
                    ));
                }
                Ok(chrono::Duration::seconds(v as i64))
            };
        let workflows = crate::service::WorkflowSettings {
            power: secs("workflows.power_seconds", w.power_seconds, 300)?,
            netboot: secs("workflows.netboot_seconds", w.netboot_seconds, 900)?,
            config: secs("workflows.config_seconds", w.config_seconds, 900)?,
            talos_api: secs("workflows.talos_api_seconds", w.talos_api_seconds, 1800)?,
            window: secs("workflows.window_seconds", w.window_seconds, 7200)?,
            health_every: secs("workflows.health_seconds", w.health_seconds, 60)?,
            talos_api_port: match w.talos_api_port {
                Some(0) => {
                    return Err(SettingsError::new(
                        "workflows.talos_api_port",
                        "must be a port number (1-65535)",
                    ))
                }
                Some(p) => p,
                None => 50000,
            },
            boot_target: match w.boot_target.as_deref().unwrap_or("pxe") {
                "pxe" => crate::service::bmc::BootTarget::Pxe,
                "http" => crate::service::bmc::BootTarget::Http,
                other => {
                    return Err(SettingsError::new(
                        "workflows.boot_target",
                        format!("`{other}` is not `pxe` or `http`"),
                    ))
                }
            },
        };
        let workflow_tick = secs("workflows.tick_seconds", w.tick_seconds, 2)?
            .to_std()
            .unwrap_or(std::time::Duration::from_secs(2));
        let u = &self.upgrades;
        let poll = secs("upgrades.poll_seconds", u.poll_seconds, 2)?;
        let lease = secs("upgrades.lease_seconds", u.lease_seconds, 30)?;
        if lease < poll * 2 {
            return Err(SettingsError::new(
                "upgrades.lease_seconds",
                "must be at least twice upgrades.poll_seconds (the lease is renewed while it is held)",
            ));
        }
        let install_wait = secs("upgrades.install_wait_seconds", u.install_wait_seconds, 900)?;
        let upgrades = crate::service::UpgradeSettings {
            poll: poll.to_std().unwrap_or(std::time::Duration::from_secs(2)),
            lease: lease.to_std().unwrap_or(std::time::Duration::from_secs(30)),
            install_wait: install_wait
                .to_std()
                .unwrap_or(std::time::Duration::from_secs(900)),
            ..Default::default()
        };
        let image_factory = match self.images.factory_url {
            Some(u) if !(u.starts_with("https://") || u.starts_with("http://")) => {
                return Err(SettingsError::new(
                    "images.factory_url",
                    format!("`{u}` is not an http(s) URL, e.g. https://factory.talos.dev"),
                ))
            }
            other => other,
        };
        let sn = &self.snapshots;
        let snapshot_tick = secs("snapshots.tick_seconds", sn.tick_seconds, 60)?
            .to_std()
            .unwrap_or(std::time::Duration::from_secs(60));
        let snapshot_turn = secs("snapshots.turn_seconds", sn.turn_seconds, 60)?;
        if snapshot_turn < chrono::Duration::seconds(3) {
            return Err(SettingsError::new(
                "snapshots.turn_seconds",
                "must be at least 3 (the turn is renewed every third of it)",
            ));
        }
        if let Some(e) = &sn.s3_endpoint {
            let lower = e.to_ascii_lowercase();
            if !(lower.starts_with("https://") || lower.starts_with("http://")) || e.contains('@') {
                return Err(SettingsError::new(
                    "snapshots.s3_endpoint",
                    format!("`{e}` is not an http(s) URL without credentials, e.g. https://s3.eu-central-1.amazonaws.com"),
                ));
            }
            if lower.starts_with("http://") && sn.s3_allow_http != Some(true) {
                return Err(SettingsError::new(
                    "snapshots.s3_endpoint",
                    "an http:// endpoint sends snapshots' requests unencrypted: set snapshots.s3_allow_http = true to allow it (the snapshots themselves are encrypted)",
                ));
            }
        }
        if let Some(f) = &sn.s3_credentials_file {
            if !f.is_file() {
                return Err(SettingsError::new(
                    "snapshots.s3_credentials_file",
                    format!("{} is not a file", f.display()),
                ));
            }
        }
        let snapshot_s3 = crate::service::ports::snapshots::S3Settings {
            endpoint: sn.s3_endpoint.clone(),
            region: sn.s3_region.clone(),
            allow_http: sn.s3_allow_http.unwrap_or(false),
            credentials_file: sn.s3_credentials_file.clone(),
        };
        Ok(Config {
            snapshot_s3,
            snapshot_tick,
            snapshot_turn,
            image_factory,
            workflows,
            workflow_tick,
            upgrades,
            talos_schema_dir,
            dhcp,
            boot_public_url,
            ipxe_dir,
            images_listen,
            images_url,
            tftp,
            data_dir,
            database_url: url,
            dialect,
            max_connections,
            http_listen,
            max_body_bytes: max_body as usize,
            secret_key,
            log_format,
            log_level,
        })
    }
}

/// Parse `IP:PORT`, naming the key on failure.
pub fn parse_addr(key: &str, v: &str) -> Result<SocketAddr, SettingsError> {
    v.trim().parse::<SocketAddr>().map_err(|_| {
        let hint = match v.rsplit_once(':') {
            Some((_, port)) if port.parse::<u16>().is_err() => {
                format!("`{port}` is not a port (0-65535)")
            }
            Some(_) => {
                "the host part must be an IP address (0.0.0.0 for every interface)".to_string()
            }
            None => "the port is missing".to_string(),
        };
        SettingsError::new(
            key,
            format!("`{v}` is not IP:PORT: {hint}; e.g. 0.0.0.0:8080 or [::]:8080"),
        )
    })
}

impl Config {
    /// Where the secret key comes from, or the refusal for a PostgreSQL database without one
    /// (every instance must share one key). The server asks before it opens anything.
    pub fn require_secret_key(&self) -> Result<&SecretKeySource, SettingsError> {
        self.secret_key.as_ref().ok_or_else(|| {
            SettingsError::new(
                "secrets.key_file",
                format!(
                    "required with a PostgreSQL database so that every instance shares one key: \
                     create one with `plinth secret-key > /etc/plinth/secret.key` and set secrets.key_file \
                     (or set {SECRET_KEY_ENV})"
                ),
            )
        })
    }

    /// Load from an optional file plus overrides.
    pub fn load(file: Option<&Path>, o: &Overrides) -> Result<Config, SettingsError> {
        let raw = match file {
            Some(p) => RawConfig::load(p)?,
            None => RawConfig::default(),
        };
        raw.validate(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_embedded_sqlite_on_8080() {
        let c = RawConfig::default()
            .validate(&Overrides::default())
            .expect("valid");
        assert_eq!(c.http_listen.port(), 8080);
        assert_eq!(c.dialect, Dialect::Sqlite);
        assert!(c.database_url.ends_with("plinth-data/plinth.db"));
    }

    #[test]
    fn unknown_key_is_named() {
        let e =
            RawConfig::parse("[http]\nlisten = \"0.0.0.0:80\"\nlistne = 1\n").expect_err("unknown");
        assert_eq!(e.key, "http.listne", "{e}");
        assert!(e.message.contains("unknown field"), "{e}");
        assert!(e.message.contains("line 3"), "{e}");
    }

    #[test]
    fn bad_types_and_addresses_are_named() {
        let e = RawConfig::parse("[database]\nmax_connections = \"many\"\n").expect_err("type");
        assert_eq!(e.key, "database.max_connections");
        let raw = RawConfig::parse("[http]\nlisten = \"0.0.0.0:80800\"\n").expect("parses");
        let e = raw.validate(&Overrides::default()).expect_err("bad port");
        assert_eq!(e.key, "http.listen");
        assert!(e.message.contains("80800"), "{e}");
        let e = RawConfig::default()
            .validate(&Overrides {
                http: Some("localhost:8080".into()),
                ..Default::default()
            })
            .expect_err("hostname");
        assert_eq!(e.key, "--http");
        let e = RawConfig::default()
            .validate(&Overrides {
                database_url: Some("mysql://x".into()),
                ..Default::default()
            })
            .expect_err("dialect");
        assert_eq!(e.key, "database.url");
    }

    #[test]
    fn relayed_subnet_answers_from_the_address_the_relay_forwards_to() {
        let dhcp = |server: &str| {
            format!(
                "[dhcp]\nenabled = true\nboot_url = \"http://10.0.0.1:8080\"\n\
                 [[dhcp.subnet]]\ncidr = \"10.0.0.0/24\"\nserver_ip = \"10.0.0.1\"\n\
                 [[dhcp.subnet]]\ncidr = \"10.9.0.0/24\"\nserver_ip = \"{server}\"\npool = [\"10.9.0.10-10.9.0.20\"]\n"
            )
        };
        let ok = RawConfig::parse(&dhcp("10.0.0.1"))
            .expect("parses")
            .validate(&Overrides::default())
            .expect("a relayed subnet may name Plinth's address on another network");
        let subnets = ok.dhcp.expect("dhcp on").subnets;
        assert_eq!(subnets[1].server_ip.to_string(), "10.0.0.1");
        for bad in [
            "0.0.0.0",
            "255.255.255.255",
            "127.0.0.1",
            "10.9.0.0",
            "10.9.0.255",
        ] {
            let e = RawConfig::parse(&dhcp(bad))
                .expect("parses")
                .validate(&Overrides::default())
                .expect_err(bad);
            assert_eq!(e.key, "dhcp.subnet[1].server_ip", "{bad}: {e}");
        }
    }

    #[test]
    fn image_door_keys() {
        let v = |toml: &str| {
            RawConfig::parse(toml)
                .expect("parses")
                .validate(&Overrides::default())
        };
        let c = v("[boot]\nimages_listen = \"0.0.0.0:8081\"\n").expect("valid");
        assert_eq!(c.images_listen, Some("0.0.0.0:8081".parse().expect("addr")));
        assert_eq!(c.images_url, None);
        let c = v(
            "[boot]\nimages_listen = \"0.0.0.0:8081\"\nimages_url = \"http://10.0.0.1:8081/\"\n",
        )
        .expect("valid");
        assert_eq!(c.images_url.as_deref(), Some("http://10.0.0.1:8081"));
        assert_eq!(v("").expect("valid").images_listen, None);
        for (toml, key) in [
            (
                "[boot]\nimages_listen = \"0.0.0.0\"\n",
                "boot.images_listen",
            ),
            (
                "[boot]\nimages_listen = \"0.0.0.0:8080\"\n",
                "boot.images_listen",
            ),
            (
                "[boot]\nimages_url = \"http://10.0.0.1:8081\"\n",
                "boot.images_url",
            ),
            (
                "[boot]\nimages_listen = \"0.0.0.0:8081\"\nimages_url = \"ftp://x\"\n",
                "boot.images_url",
            ),
        ] {
            assert_eq!(v(toml).expect_err(toml).key, key, "{toml}");
        }
    }

    #[test]
    fn postgres_needs_a_shared_key() {
        if std::env::var_os(SECRET_KEY_ENV).is_some() {
            return; // the environment supplies the key; the rule does not apply
        }
        let c = RawConfig::default()
            .validate(&Overrides {
                database_url: Some("postgres://u@h/db".into()),
                ..Default::default()
            })
            .expect("valid for commands that need no key (migrate, token)");
        let e = c.require_secret_key().expect_err("needs key");
        assert_eq!(e.key, "secrets.key_file");
    }

    #[test]
    fn settings_file_is_flag_then_environment_then_system_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let system = dir.path().join("plinth.toml");
        let flag = Path::new("/srv/a.toml");
        let env = || Some("/srv/b.toml".to_string());
        assert_eq!(
            SettingsFile::locate_with(Some(flag), env(), &system),
            SettingsFile::Flag(flag.into())
        );
        assert_eq!(
            SettingsFile::locate_with(None, env(), &system),
            SettingsFile::Env("/srv/b.toml".into())
        );
        assert_eq!(
            SettingsFile::locate_with(None, None, &system),
            SettingsFile::Defaults,
            "a system file that does not exist is not used"
        );
        std::fs::write(&system, "").expect("write");
        assert_eq!(
            SettingsFile::locate_with(None, None, &system),
            SettingsFile::System(system.clone())
        );
        assert_eq!(
            SettingsFile::locate_with(Some(Path::new("")), None, &system),
            SettingsFile::System(system),
            "an empty --config counts as not given"
        );
    }

    #[test]
    fn example_config_parses_and_validates() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("plinth.example.toml");
        let raw = RawConfig::load(&path).expect("example parses");
        let c = raw
            .validate(&Overrides::default())
            .expect("example validates");
        assert_eq!(c.http_listen, "0.0.0.0:8080".parse().expect("addr"));
    }
}

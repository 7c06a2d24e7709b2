//! The command line: `plinth serve`, `migrate`, `token`, `secret-key`, and `machine ...` (and
//! `bmc ...`, in `cli_bmc`), which talk to a running server's API (table output by default,
//! `--json` for scripts).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use serde_json::{json, Map, Value};

use crate::config::Overrides;

/// Plinth: bare-metal provisioning for Talos Linux.
#[derive(Debug, Parser)]
#[command(name = "plinth", version, about)]
pub struct Cli {
    /// TOML configuration file (see plinth.example.toml). Without one, the embedded defaults apply.
    #[arg(long, global = true, env = "PLINTH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory (SQLite database, generated secret key, caches).
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// Database URL: sqlite://PATH or postgres://USER@HOST/DB.
    #[arg(long, global = true, env = "PLINTH_DATABASE_URL")]
    pub database_url: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve {
        /// HTTP listen address, e.g. 0.0.0.0:8080.
        #[arg(long)]
        http: Option<String>,
    },
    /// Apply pending database migrations and exit.
    Migrate,
    /// Manage API tokens directly in the database (no server needed).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Print a new random secret key (for secrets.key_file or PLINTH_SECRET_KEY).
    SecretKey,
    /// Register and manage machines through the API of a running server.
    Machine(Box<MachineArgs>),
    /// Drive a machine's BMC (power, one-time boot, virtual media) through the API.
    Bmc(Box<crate::cli_bmc::BmcArgs>),
    /// Manage the Talos image cache in the data directory (no server needed).
    #[command(subcommand)]
    Image(ImageCommand),
    /// Talos clusters.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Talos machine configs: generate, patch and validate files; render and diff a machine's.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Load a declarative inventory directory (clusters, profiles, sites, racks, machines) into
    /// the database; prints what changes and the diff of every machine's config (secrets redacted).
    Apply {
        /// The directory (see inventory/ in the repository).
        dir: PathBuf,
        /// Show what would change; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// `plinth config ...`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Apply patches to a machine config file and print the result, as `talosctl machineconfig
    /// patch` does: strategic merge patches (typed merge rules, `$patch: delete`) or RFC 6902 JSON
    /// patches (refused on multi-document configs, as Talos does).
    Patch {
        /// The machine config (multi-document YAML).
        file: PathBuf,
        /// A patch: `@FILE` or inline YAML/JSON; repeat to apply several in order.
        #[arg(long = "patch", short = 'p', required = true)]
        patches: Vec<String>,
        /// Write here instead of stdout.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
    },
    /// Validate a machine config against the Talos JSON schema of its version and Talos's own rules.
    Validate {
        /// The machine config.
        file: PathBuf,
        /// Target Talos version, e.g. v1.11.6.
        #[arg(long)]
        version: String,
        /// The JSON schema of that version (config.schema.json from the Talos release).
        #[arg(long)]
        schema: PathBuf,
    },
    /// Generate the base machine config of a role from a secrets bundle, natively, in the shape
    /// `talosctl gen config` writes for that Talos release, and print it. Control-plane configs
    /// carry the cluster's private keys: keep them out of Git.
    Generate {
        /// The secrets bundle (from `plinth cluster init` or `talosctl gen secrets`).
        #[arg(long)]
        secrets: PathBuf,
        /// Cluster name.
        #[arg(long)]
        name: String,
        /// Control-plane endpoint, e.g. https://10.0.0.10:6443.
        #[arg(long)]
        endpoint: String,
        /// Target Talos version, e.g. v1.11.6.
        #[arg(long)]
        talos_version: String,
        /// `controlplane` or `worker`.
        #[arg(long)]
        role: String,
        /// Kubernetes version (default: that of the Talos release).
        #[arg(long)]
        kubernetes_version: Option<String>,
        /// Installer image (default: ghcr.io/siderolabs/installer:<talos-version>).
        #[arg(long)]
        install_image: Option<String>,
        /// Install disk, e.g. /dev/sda (default: none, left to the machine's facts).
        #[arg(long)]
        install_disk: Option<String>,
    },
    /// Print the config Plinth would serve a machine now (from the database; it carries the
    /// cluster's secrets). Warnings and the install disk go to stderr.
    Render {
        /// The machine (id, host name, MAC, serial, asset tag or SMBIOS UUID).
        machine: String,
    },
    /// Compare a machine's config now with the one it was last served (secrets redacted).
    Diff {
        /// The machine.
        machine: String,
    },
}

/// Run `plinth config ...`.
pub fn config(cmd: ConfigCommand) -> anyhow::Result<()> {
    use crate::talos::{patch, validate, MachineConfig, TalosVersion};
    match cmd {
        ConfigCommand::Render { .. } | ConfigCommand::Diff { .. } => {
            bail!("`config render` and `config diff` read the database: run them through `plinth`")
        }
        ConfigCommand::Patch {
            file,
            patches,
            output,
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let cfg = MachineConfig::parse(&text).with_context(|| format!("{}", file.display()))?;
            let mut loaded = Vec::new();
            for p in &patches {
                let patch = match p.strip_prefix('@') {
                    Some(path) => patch::load_patch_file(std::path::Path::new(path))
                        .with_context(|| format!("patch {path}"))?,
                    None => patch::load_patch(p).context("inline patch")?,
                };
                loaded.push(patch);
            }
            let out = patch::apply(&cfg, &loaded)?.to_yaml()?;
            match output {
                Some(o) => std::fs::write(&o, out)
                    .with_context(|| format!("cannot write {}", o.display()))?,
                None => say(out.trim_end()),
            }
        }
        ConfigCommand::Validate {
            file,
            version,
            schema,
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let cfg = MachineConfig::parse(&text).with_context(|| format!("{}", file.display()))?;
            let version: TalosVersion = version
                .parse()
                .map_err(|e| anyhow::anyhow!("--version: {e}"))?;
            match validate::validate_with_schema_file(&cfg, &schema, version) {
                Ok(warnings) => {
                    for w in &warnings {
                        eprintln!("warning: {w}");
                    }
                    say(format!(
                        "{}: valid for Talos {version} ({} warning(s))",
                        file.display(),
                        warnings.len()
                    ));
                }
                Err(validate::ValidateError::Invalid(report)) => {
                    for w in &report.warnings {
                        eprintln!("warning: {w}");
                    }
                    for e in &report.errors {
                        eprintln!("error: {e}");
                    }
                    bail!(
                        "{}: {} error(s); this config would not be served",
                        file.display(),
                        report.errors.len()
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
        ConfigCommand::Generate {
            secrets,
            name,
            endpoint,
            talos_version,
            role,
            kubernetes_version,
            install_image,
            install_disk,
        } => {
            use crate::domain::Role;
            use crate::talos::generate::{generate, GenerateOptions};
            use crate::talos::secrets::SecretsBundle;
            let version: TalosVersion = talos_version
                .parse()
                .map_err(|e| anyhow::anyhow!("--talos-version: {e}"))?;
            let role = match role.trim().to_ascii_lowercase().as_str() {
                "controlplane" | "control-plane" => Role::ControlPlane,
                "worker" => Role::Worker,
                other => bail!("--role: `{other}` is not one of: controlplane, worker"),
            };
            let text = std::fs::read_to_string(&secrets)
                .with_context(|| format!("cannot read {}", secrets.display()))?;
            let bundle =
                SecretsBundle::parse(&text).with_context(|| format!("{}", secrets.display()))?;
            let opts = GenerateOptions {
                kubernetes_version,
                install_image,
                install_disk,
                ..GenerateOptions::new(name, endpoint, version)
            };
            say(generate(&bundle, role, &opts)?.to_yaml()?.trim_end());
        }
    }
    Ok(())
}

/// `plinth cluster ...`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Generate a new cluster secrets bundle natively (as `talosctl gen secrets` does) into a file
    /// readable only by its owner. Keep it out of Git.
    Init {
        /// Cluster name.
        name: String,
        /// Control-plane endpoint, e.g. https://10.0.0.10:6443.
        #[arg(long)]
        endpoint: String,
        /// Where to write the bundle (refuses to overwrite).
        #[arg(long)]
        out: PathBuf,
    },
    /// Bootstrap the cluster's etcd on one control plane, exactly once (admins; refused, naming
    /// when and where, once the cluster was bootstrapped).
    Bootstrap {
        /// Cluster name.
        name: String,
        /// The node (host name, id or address); default: the first verified control plane.
        #[arg(long)]
        node: Option<String>,
        /// Connection to the API.
        #[command(flatten)]
        api: crate::cli_cluster::ApiConn,
    },
    /// Print a talosconfig signed now from the cluster's OS CA (admins; an event names you).
    Talosconfig {
        /// Cluster name.
        name: String,
        /// Talos role: os:admin, os:operator, os:reader or os:etcd:backup.
        #[arg(long, default_value = "os:admin")]
        role: String,
        /// Lifetime: 30m, 8h, 7d (at most 30 days).
        #[arg(long, default_value = "8h")]
        ttl: String,
        /// Connection to the API.
        #[command(flatten)]
        api: crate::cli_cluster::ApiConn,
    },
    /// Print an admin kubeconfig signed now from the cluster's Kubernetes CA (admins; an event
    /// names you).
    Kubeconfig {
        /// Cluster name.
        name: String,
        /// Lifetime: 30m, 8h, 7d (at most 30 days).
        #[arg(long, default_value = "8h")]
        ttl: String,
        /// Connection to the API.
        #[command(flatten)]
        api: crate::cli_cluster::ApiConn,
    },
    /// Per node: Talos version, apid, etcd/kubelet/apid/trustd, etcd members and leader, quorum.
    Health {
        /// Cluster name.
        name: String,
        /// The last stored measurement instead of measuring now.
        #[arg(long)]
        cached: bool,
        /// Connection to the API.
        #[command(flatten)]
        api: crate::cli_cluster::ApiConn,
    },
}

/// Run `plinth cluster ...`.
pub fn cluster(cmd: ClusterCommand) -> anyhow::Result<()> {
    match cmd {
        ClusterCommand::Init {
            name,
            endpoint,
            out,
        } => {
            crate::domain::machine::check_hostname(&name)
                .map_err(|e| anyhow::anyhow!("cluster name: {e}"))?;
            let rest = endpoint
                .strip_prefix("https://")
                .ok_or_else(|| anyhow::anyhow!("--endpoint: `{endpoint}` must be an https:// URL such as https://10.0.0.10:6443"))?;
            if rest.split('/').next().is_none_or(str::is_empty) {
                bail!("--endpoint: `{endpoint}` has no host");
            }
            let bundle = crate::talos::secrets::SecretsBundle::generate()?;
            let yaml = bundle.to_yaml()?;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = opts.open(&out).with_context(|| {
                format!("cannot create {} (it must not exist yet)", out.display())
            })?;
            use std::io::Write as _;
            f.write_all(yaml.as_bytes())?;
            f.sync_all()?;
            eprintln!("secrets bundle for cluster {name} ({endpoint}) written to {} (mode 0600); keep it out of Git", out.display());
        }
        other => {
            bail!("plinth cluster {other:?} talks to the API: run it through cli_cluster::run")
        }
    }
    Ok(())
}

/// `plinth image ...`.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Import a kernel and initramfs (air-gapped sites): verified, written atomically.
    Import {
        /// Talos version, e.g. v1.11.6.
        #[arg(long)]
        version: String,
        /// amd64 or arm64.
        #[arg(long, default_value = "amd64")]
        arch: String,
        /// Image Factory schematic id (default: the vanilla schematic).
        #[arg(long, default_value = crate::images::VANILLA_SCHEMATIC)]
        schematic: String,
        /// Kernel file.
        #[arg(long)]
        kernel: PathBuf,
        /// Initramfs file.
        #[arg(long)]
        initramfs: PathBuf,
    },
    /// Download a kernel and initramfs from an Image Factory into the cache, with progress
    /// (verified, written atomically; files already cached are kept).
    Pull {
        /// Talos version, e.g. v1.11.6.
        #[arg(long)]
        version: String,
        /// amd64 or arm64.
        #[arg(long, default_value = "amd64")]
        arch: String,
        /// Image Factory schematic id (default: the vanilla schematic).
        #[arg(long, default_value = crate::images::VANILLA_SCHEMATIC)]
        schematic: String,
        /// Image Factory base URL (default: [images].factory_url, else the public factory).
        #[arg(long)]
        factory: Option<String>,
    },
    /// List cached images.
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Remove a cached version.
    Rm {
        /// Talos version.
        #[arg(long)]
        version: String,
        /// Schematic id (default: vanilla).
        #[arg(long, default_value = crate::images::VANILLA_SCHEMATIC)]
        schematic: String,
    },
}

/// `plinth image pull`: download with a progress bar on stderr.
pub async fn image_pull(
    cache: &crate::images::ImageCache,
    factory: &str,
    version: &str,
    arch: &str,
    schematic: &str,
) -> anyhow::Result<()> {
    use crate::domain::dhcp::Arch;
    let arch = match arch {
        "amd64" | "x86_64" => Arch::Amd64,
        "arm64" | "aarch64" => Arch::Arm64,
        other => bail!("--arch: `{other}` is not amd64 or arm64"),
    };
    let puller = crate::images::ImagePuller::new(cache.clone(), factory)?;
    type Bars = std::collections::HashMap<String, indicatif::ProgressBar>;
    let bars: std::sync::Arc<std::sync::Mutex<Bars>> = std::sync::Arc::default();
    let style = indicatif::ProgressStyle::with_template(
        "{msg:22} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    let b = bars.clone();
    let progress: crate::images::Progress = std::sync::Arc::new(move |name, done, total| {
        let mut bars = b.lock().unwrap_or_else(|p| p.into_inner());
        let bar = bars.entry(name.to_string()).or_insert_with(|| {
            let bar = indicatif::ProgressBar::with_draw_target(
                total,
                indicatif::ProgressDrawTarget::stderr(),
            );
            bar.set_style(style.clone());
            bar.set_message(name.to_string());
            bar
        });
        bar.set_position(done);
    });
    let files = puller
        .pull(schematic, version, arch, Some(progress))
        .await
        .with_context(|| format!("pulling Talos {version} ({schematic}) from {factory}"))?;
    for bar in bars.lock().unwrap_or_else(|p| p.into_inner()).values() {
        bar.finish();
    }
    for (f, downloaded) in files {
        say(format!(
            "{} {}/{}/{} ({} bytes, sha256 {})",
            if downloaded { "pulled" } else { "cached" },
            f.schematic,
            f.version,
            f.name,
            f.size,
            f.sha256
        ));
    }
    Ok(())
}

/// Run `plinth image ...` against the cache of a data directory.
pub fn image(cache: &crate::images::ImageCache, cmd: ImageCommand) -> anyhow::Result<()> {
    use crate::domain::dhcp::Arch;
    use crate::images::{initramfs_name, kernel_name};
    match cmd {
        ImageCommand::Import {
            version,
            arch,
            schematic,
            kernel,
            initramfs,
        } => {
            let arch = match arch.as_str() {
                "amd64" | "x86_64" => Arch::Amd64,
                "arm64" | "aarch64" => Arch::Arm64,
                other => bail!("--arch: `{other}` is not amd64 or arm64"),
            };
            for (name, src) in [
                (kernel_name(arch), &kernel),
                (initramfs_name(arch), &initramfs),
            ] {
                let f = cache.import(&schematic, &version, &name, src)?;
                say(format!(
                    "imported {}/{}/{} ({} bytes, sha256 {})",
                    f.schematic, f.version, f.name, f.size, f.sha256
                ));
            }
        }
        ImageCommand::Pull { .. } => {
            bail!("`image pull` runs asynchronously: call image_pull")
        }
        ImageCommand::List { json } => {
            let files = cache.list();
            if json {
                say(serde_json::to_string_pretty(&files)?);
            } else {
                let mut t = Table::new();
                t.load_preset(UTF8_BORDERS_ONLY);
                t.set_header(["SCHEMATIC", "VERSION", "FILE", "BYTES", "SHA256"]);
                for f in &files {
                    t.add_row([
                        f.schematic.clone(),
                        f.version.clone(),
                        f.name.clone(),
                        f.size.to_string(),
                        f.sha256.clone(),
                    ]);
                }
                say(&t);
            }
        }
        ImageCommand::Rm { version, schematic } => {
            let n = cache.remove(&schematic, &version)?;
            if n == 0 {
                bail!("no cached files for {schematic}/{version}");
            }
            say(format!("removed {n} file(s) of {schematic}/{version}"));
        }
    }
    Ok(())
}

/// `plinth token ...`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Mint a token and print it (only the token, once) on stdout.
    Create {
        /// viewer, operator or admin.
        #[arg(long)]
        role: String,
        /// Name, shown as the actor of events (default: the role).
        #[arg(long)]
        name: Option<String>,
        /// Expire after this many days.
        #[arg(long)]
        expires_in_days: Option<u32>,
    },
    /// List tokens (never their secrets).
    List,
    /// Revoke a token by id.
    Revoke {
        /// Token id.
        id: String,
    },
}

/// Connection to the API.
#[derive(Debug, Args)]
pub struct MachineArgs {
    /// Server URL.
    #[arg(
        long,
        global = true,
        env = "PLINTH_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// API token.
    #[arg(long, global = true, env = "PLINTH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: MachineCommand,
}

/// `plinth machine ...`.
#[derive(Debug, Subcommand)]
pub enum MachineCommand {
    /// Register a machine.
    Add(Box<AddArgs>),
    /// List machines.
    List {
        /// Lifecycle state.
        #[arg(long)]
        state: Option<String>,
        /// Site.
        #[arg(long)]
        site: Option<String>,
        /// Rack.
        #[arg(long)]
        rack: Option<String>,
        /// Cluster.
        #[arg(long)]
        cluster: Option<String>,
        /// Role.
        #[arg(long)]
        role: Option<String>,
        /// Free-text search.
        #[arg(long, short)]
        q: Option<String>,
        /// Page size; with --all, pages are followed to the end.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Fetch every page.
        #[arg(long)]
        all: bool,
    },
    /// Show one machine (id, host name, MAC, serial, asset tag or SMBIOS UUID).
    Show {
        /// The machine.
        machine: String,
    },
    /// Change fields: `--set rack=r12 --set rack_unit=7 --set bmc.url=https://10.0.0.5`; an empty
    /// value clears the field; values that are JSON (numbers, arrays, objects) are sent as JSON.
    Edit {
        /// The machine.
        machine: String,
        /// key=value.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// A JSON merge patch file.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Inspect a machine through its BMC and update the inventory; prints what changed and the
    /// conflicts that were not written.
    Inspect {
        /// The machine.
        machine: String,
    },
    /// Open the machine's provisioning window (its config must render and validate; it becomes
    /// `provisioning` and its next network boot installs Talos), or close it with `--close`.
    Provision {
        /// The machine.
        machine: String,
        /// How long the window stays open, seconds (60-86400).
        #[arg(long, default_value_t = 3600)]
        ttl: u32,
        /// Wipe the system disk on the install boot.
        #[arg(long)]
        wipe: bool,
        /// Close the window instead.
        #[arg(long)]
        close: bool,
    },
    /// Reinstall a machine: open its window, one-time network boot and power cycle through the
    /// BMC (or a tech does it), then follow it to `installed`; `--follow` prints its events until
    /// it is done or failed.
    Reinstall {
        /// The machine.
        machine: String,
        /// Wipe the system disk on the install boot.
        #[arg(long)]
        wipe: bool,
        /// Follow the reinstall's events until it ends.
        #[arg(long)]
        follow: bool,
    },
    /// The events of a machine (or all with `--all`), optionally following new ones live.
    Events {
        /// The machine.
        machine: Option<String>,
        /// Kind prefix, e.g. `reinstall.`.
        #[arg(long)]
        kind: Option<String>,
        /// Keep printing new events as they happen (Ctrl-C to stop).
        #[arg(long)]
        follow: bool,
    },
    /// Whether a machine's config renders, its digest, warnings and provisioning window.
    Config {
        /// The machine.
        machine: String,
    },
    /// Move a machine along its lifecycle, e.g. accept a discovered one: `state NAME registered`.
    State {
        /// The machine.
        machine: String,
        /// discovered, registered, inspecting, ready, provisioning, installed, failed, maintenance.
        state: String,
        /// Why (required for failed).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Remove a machine.
    Rm {
        /// The machine.
        machine: String,
    },
    /// Import a CSV or JSON file as one transaction.
    Import {
        /// The file (.csv or .json).
        file: PathBuf,
        /// csv or json (default: from the file name).
        #[arg(long)]
        format: Option<String>,
    },
}

/// `plinth machine add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// A JSON file with the whole machine (fields below override it).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Host name.
    #[arg(long)]
    pub hostname: Option<String>,
    /// NIC MAC address; repeat for more NICs (the first is the boot NIC).
    #[arg(long = "mac")]
    pub macs: Vec<String>,
    /// Reserved IPv4 of the first NIC.
    #[arg(long)]
    pub ip: Option<String>,
    /// Serial number.
    #[arg(long)]
    pub serial: Option<String>,
    /// Asset tag.
    #[arg(long)]
    pub asset_tag: Option<String>,
    /// SMBIOS UUID.
    #[arg(long)]
    pub uuid: Option<String>,
    /// Manufacturer.
    #[arg(long)]
    pub manufacturer: Option<String>,
    /// Model.
    #[arg(long)]
    pub model: Option<String>,
    /// Site.
    #[arg(long)]
    pub site: Option<String>,
    /// Rack.
    #[arg(long)]
    pub rack: Option<String>,
    /// Rack unit.
    #[arg(long)]
    pub unit: Option<u16>,
    /// control-plane or worker.
    #[arg(long)]
    pub role: Option<String>,
    /// Cluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Profile.
    #[arg(long)]
    pub profile: Option<String>,
    /// BMC Redfish URL.
    #[arg(long)]
    pub bmc_url: Option<String>,
    /// BMC user.
    #[arg(long)]
    pub bmc_user: Option<String>,
    /// File holding the BMC password (or set PLINTH_BMC_PASSWORD); never on the command line.
    #[arg(long)]
    pub bmc_password_file: Option<PathBuf>,
    /// BMC TLS mode: verify, pinned or insecure.
    #[arg(long)]
    pub bmc_tls: Option<String>,
    /// BMC certificate SHA-256 fingerprint (with --bmc-tls pinned).
    #[arg(long)]
    pub bmc_fingerprint: Option<String>,
}

impl Cli {
    /// Overrides for `Config::load`.
    pub fn overrides(&self) -> Overrides {
        let http = match &self.command {
            Command::Serve { http } => http.clone(),
            _ => None,
        };
        Overrides {
            data_dir: self.data_dir.clone(),
            http,
            database_url: self.database_url.clone(),
        }
    }
}

/// A small client of the Plinth API.
pub struct ApiClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl ApiClient {
    /// For `server`, authenticating with `token`.
    pub fn new(server: &str, token: Option<String>) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(300))
            .build()
            .context("HTTP client")?;
        Ok(Self {
            base: server.trim_end_matches('/').to_string(),
            token,
            http,
        })
    }

    pub(crate) fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self
            .http
            .request(method, format!("{}/api/v1{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Send and decode; an error answer becomes an error naming its fields, rows and conflicts.
    pub async fn send(
        &self,
        rb: reqwest::RequestBuilder,
    ) -> anyhow::Result<(reqwest::header::HeaderMap, Value)> {
        let resp = rb
            .send()
            .await
            .with_context(|| format!("cannot reach Plinth at {}", self.base))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap_or_default();
        let body: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            return Ok((headers, body));
        }
        bail!("{}", describe_error(status.as_u16(), &body))
    }

    pub(crate) async fn get_machine(&self, reference: &str) -> anyhow::Result<(i64, Value)> {
        let path = if let Ok(mac) = reference.parse::<crate::domain::MacAddr>() {
            format!("/machines/lookup?mac={mac}")
        } else {
            format!("/machines/{}", urlencode(reference))
        };
        let (h, body) = match self.send(self.req(reqwest::Method::GET, &path)).await {
            Ok(ok) => ok,
            Err(first) => {
                // Not an id or host name: try serial, asset tag, SMBIOS UUID.
                let mut found = None;
                for key in ["serial", "asset_tag", "uuid"] {
                    let p = format!("/machines/lookup?{key}={}", urlencode(reference));
                    if let Ok(ok) = self.send(self.req(reqwest::Method::GET, &p)).await {
                        found = Some(ok);
                        break;
                    }
                }
                found.ok_or(first)?
            }
        };
        let version = etag_version(&h)
            .or_else(|| body["version"].as_i64())
            .context("answer has no version")?;
        Ok((version, body))
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn etag_version(h: &reqwest::header::HeaderMap) -> Option<i64> {
    h.get(reqwest::header::ETAG)?
        .to_str()
        .ok()?
        .trim_matches('"')
        .parse()
        .ok()
}

/// Human text for an API error answer.
pub fn describe_error(status: u16, body: &Value) -> String {
    let e = &body["error"];
    let mut out = format!(
        "HTTP {status}: {}",
        e["message"].as_str().unwrap_or(&body.to_string())
    );
    for f in e["fields"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  {}: {}",
            f["field"].as_str().unwrap_or("-"),
            f["message"].as_str().unwrap_or("")
        ));
    }
    for c in e["conflicts"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  {}: {} belongs to {} ({})",
            c["field"].as_str().unwrap_or("-"),
            c["value"].as_str().unwrap_or(""),
            c["owner"]["name"].as_str().unwrap_or(""),
            c["owner"]["id"].as_str().unwrap_or("")
        ));
    }
    for r in e["rows"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  line {}: {}: {}",
            r["line"],
            r["field"].as_str().unwrap_or("-"),
            r["message"].as_str().unwrap_or("")
        ));
    }
    out
}

fn opt(v: &Option<String>) -> Value {
    v.as_ref().map_or(Value::Null, |s| Value::String(s.clone()))
}

/// Turn `key=value` pairs into a merge patch (dotted keys nest; empty values clear).
pub fn set_patch(pairs: &[String]) -> anyhow::Result<Value> {
    let mut root = Map::new();
    for pair in pairs {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("`{pair}` is not KEY=VALUE"))?;
        let value = if v.is_empty() {
            Value::Null
        } else {
            match serde_json::from_str::<Value>(v) {
                Ok(
                    j @ (Value::Number(_) | Value::Array(_) | Value::Object(_) | Value::Bool(_)),
                ) => j,
                _ => Value::String(v.to_string()),
            }
        };
        let mut cur = &mut root;
        let parts: Vec<&str> = k.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            if i + 1 == parts.len() {
                cur.insert((*part).to_string(), value.clone());
            } else {
                let next = cur
                    .entry((*part).to_string())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !next.is_object() {
                    *next = Value::Object(Map::new());
                }
                cur = next.as_object_mut().context("nested key")?;
            }
        }
    }
    Ok(Value::Object(root))
}

fn machine_spec(a: &AddArgs) -> anyhow::Result<Value> {
    let mut spec = match &a.file {
        Some(f) => serde_json::from_str(
            &std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        )
        .with_context(|| format!("{} is not JSON", f.display()))?,
        None => json!({}),
    };
    let fields = [
        ("hostname", opt(&a.hostname)),
        ("serial", opt(&a.serial)),
        ("asset_tag", opt(&a.asset_tag)),
        ("smbios_uuid", opt(&a.uuid)),
        ("manufacturer", opt(&a.manufacturer)),
        ("model", opt(&a.model)),
        ("site", opt(&a.site)),
        ("rack", opt(&a.rack)),
        ("rack_unit", a.unit.map_or(Value::Null, |u| json!(u))),
        ("role", opt(&a.role)),
        ("cluster", opt(&a.cluster)),
        ("profile", opt(&a.profile)),
    ];
    for (k, v) in fields {
        if !v.is_null() {
            spec[k] = v;
        }
    }
    if !a.macs.is_empty() {
        let nics: Vec<Value> = a
            .macs
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let mut n = json!({"mac": m, "boot": i == 0});
                if i == 0 {
                    if let Some(ip) = &a.ip {
                        n["ipv4"] = json!(ip);
                    }
                }
                n
            })
            .collect();
        spec["interfaces"] = Value::Array(nics);
    } else if a.ip.is_some() {
        bail!("--ip needs --mac: the address is reserved for a NIC");
    }
    if let Some(url) = &a.bmc_url {
        let mut b = json!({"url": url, "username": a.bmc_user.clone().unwrap_or_default()});
        let pw = match (
            &a.bmc_password_file,
            std::env::var("PLINTH_BMC_PASSWORD").ok(),
        ) {
            (Some(f), _) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("cannot read {}", f.display()))?
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            ),
            (None, env) => env,
        };
        if let Some(pw) = pw {
            b["password"] = json!(pw);
        }
        if let Some(t) = &a.bmc_tls {
            b["tls"] = json!(t);
        }
        if let Some(fp) = &a.bmc_fingerprint {
            b["fingerprint"] = json!(fp);
        }
        spec["bmc"] = b;
    }
    Ok(spec)
}

fn print_event(json_out: bool, e: &Value) {
    if json_out {
        say(e);
    } else {
        say(format!(
            "{} {:<28} {:<10} {} {}",
            s(&e["at"]),
            s(&e["kind"]),
            s(&e["actor"]),
            s(&e["machine_id"]),
            e["detail"]
        ));
    }
}

/// Print events from the live stream (server-sent events); with `until_done`, stop after a
/// reinstall ends (`reinstall.done` or `reinstall.failed`), failing on the latter.
async fn follow_events(
    api: &ApiClient,
    machine: Option<&str>,
    kind: Option<&str>,
    until_done: bool,
) -> anyhow::Result<()> {
    let resp = open_event_stream(api, machine, kind).await?;
    print_event_stream(resp, until_done).await
}

/// Open the live stream. The server fixes the stream's starting point before it answers, so
/// every event written after this returns is in the stream: open it before starting what it is
/// to show (a reinstall's first stage can be written before a stream opened afterwards starts).
async fn open_event_stream(
    api: &ApiClient,
    machine: Option<&str>,
    kind: Option<&str>,
) -> anyhow::Result<reqwest::Response> {
    let mut q = vec![];
    if let Some(m) = machine {
        q.push(format!("machine={m}"));
    }
    if let Some(k) = kind {
        q.push(format!("kind={}", urlencode(k)));
    }
    let resp = api
        .req(
            reqwest::Method::GET,
            &format!("/events/stream?{}", q.join("&")),
        )
        .timeout(std::time::Duration::from_secs(365 * 24 * 3600))
        .send()
        .await
        .context("event stream")?;
    if !resp.status().is_success() {
        bail!("event stream: HTTP {}", resp.status());
    }
    Ok(resp)
}

/// Print the events of an open stream (see `follow_events`).
async fn print_event_stream(mut resp: reqwest::Response, until_done: bool) -> anyhow::Result<()> {
    let mut buf = String::new();
    while let Some(chunk) = resp.chunk().await.context("event stream")? {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let data: String = block
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            let Ok(e) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            print_event(false, &e);
            if until_done {
                match e["kind"].as_str() {
                    Some("reinstall.done") => return Ok(()),
                    Some("reinstall.failed") => {
                        bail!("reinstall failed: {}", s(&e["detail"]["error"]))
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn s(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn boot_nic(m: &Value) -> (String, String) {
    let nics = m["interfaces"].as_array().cloned().unwrap_or_default();
    let nic = nics
        .iter()
        .find(|n| n["boot"] == json!(true))
        .or(nics.first())
        .cloned()
        .unwrap_or(Value::Null);
    (s(&nic["mac"]), s(&nic["ipv4"]))
}

fn print_list(items: &[Value]) {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header([
        "ID", "HOSTNAME", "STATE", "ROLE", "CLUSTER", "RACK/U", "BOOT MAC", "IPV4", "SERIAL",
    ]);
    for m in items {
        let (mac, ip) = boot_nic(m);
        let rack = match (s(&m["rack"]), s(&m["rack_unit"])) {
            (r, u) if u.is_empty() => r,
            (r, u) => format!("{r}/{u}"),
        };
        t.add_row([
            s(&m["id"]),
            s(&m["hostname"]),
            s(&m["state"]),
            s(&m["role"]),
            s(&m["cluster"]),
            rack,
            mac,
            ip,
            s(&m["serial"]),
        ]);
    }
    say(&t);
}

fn print_machine(m: &Value) {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    for k in [
        "id",
        "hostname",
        "state",
        "state_reason",
        "role",
        "cluster",
        "profile",
        "site",
        "rack",
        "rack_unit",
        "serial",
        "asset_tag",
        "smbios_uuid",
        "manufacturer",
        "model",
        "version",
        "created_at",
        "updated_at",
    ] {
        if !m[k].is_null() {
            t.add_row([k.to_string(), s(&m[k])]);
        }
    }
    if let Some(b) = m["bmc"].as_object() {
        t.add_row([
            "bmc".to_string(),
            format!(
                "{} (user {}, tls {}, password {})",
                s(&b["url"]),
                s(&b["username"]),
                s(&b["tls"]),
                if b["has_password"] == json!(true) {
                    "stored"
                } else {
                    "none"
                }
            ),
        ]);
    }
    for n in m["interfaces"].as_array().into_iter().flatten() {
        let boot = if n["boot"] == json!(true) {
            " (boot)"
        } else {
            ""
        };
        t.add_row([
            "interface".to_string(),
            format!("{} {}{boot}", s(&n["mac"]), s(&n["ipv4"]))
                .trim()
                .to_string(),
        ]);
    }
    for d in m["disks"].as_array().into_iter().flatten() {
        t.add_row([
            "disk".to_string(),
            format!(
                "{} {} {} {}B{}",
                s(&d["type"]),
                s(&d["model"]),
                s(&d["serial"]),
                s(&d["size_bytes"]),
                if d["data_disk"] == json!(true) {
                    " data"
                } else {
                    ""
                }
            ),
        ]);
    }
    say(&t);
}

/// Print a line to stdout; a closed pipe (`plinth machine list | head`) ends the program quietly
/// instead of panicking as `println!` would.
pub(crate) fn say(text: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{text}").is_err() {
        std::process::exit(0);
    }
}

pub(crate) fn emit(json_out: bool, v: &Value, human: impl FnOnce(&Value)) {
    if json_out {
        say(serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        human(v);
    }
}

/// Run `plinth machine ...`.
pub async fn machine(args: Box<MachineArgs>) -> anyhow::Result<()> {
    let api = ApiClient::new(&args.server, args.token.clone())?;
    use reqwest::Method;
    match args.command {
        MachineCommand::Add(a) => {
            let spec = machine_spec(&a)?;
            let (_, m) = api
                .send(api.req(Method::POST, "/machines").json(&spec))
                .await?;
            emit(args.json, &m, print_machine);
        }
        MachineCommand::List {
            state,
            site,
            rack,
            cluster,
            role,
            q,
            limit,
            all,
        } => {
            let mut items = Vec::new();
            let mut cursor: Option<String> = None;
            let mut total;
            loop {
                let mut query: Vec<(&str, String)> = vec![("limit", limit.to_string())];
                for (k, v) in [
                    ("state", &state),
                    ("site", &site),
                    ("rack", &rack),
                    ("cluster", &cluster),
                    ("role", &role),
                    ("q", &q),
                ] {
                    if let Some(v) = v {
                        query.push((k, v.clone()));
                    }
                }
                if let Some(c) = &cursor {
                    query.push(("cursor", c.clone()));
                }
                let (_, page) = api
                    .send(api.req(Method::GET, "/machines").query(&query))
                    .await?;
                total = page["total"].as_i64().unwrap_or(0);
                items.extend(page["items"].as_array().cloned().unwrap_or_default());
                cursor = page["next_cursor"].as_str().map(str::to_string);
                if !all || cursor.is_none() {
                    break;
                }
            }
            if args.json {
                say(serde_json::to_string_pretty(&items)?);
            } else {
                print_list(&items);
                let more = if cursor.is_some() {
                    " (more: use --all)"
                } else {
                    ""
                };
                say(format!("{} of {total} machine(s){more}", items.len()));
            }
        }
        MachineCommand::Show { machine } => {
            let (_, m) = api.get_machine(&machine).await?;
            emit(args.json, &m, print_machine);
        }
        MachineCommand::Edit { machine, set, file } => {
            let mut patch = set_patch(&set)?;
            if let Some(f) = file {
                let text = std::fs::read_to_string(&f)
                    .with_context(|| format!("cannot read {}", f.display()))?;
                let from_file: Value = serde_json::from_str(&text)
                    .with_context(|| format!("{} is not JSON", f.display()))?;
                crate::service::inventory::merge_patch(&mut patch, &from_file);
            }
            if patch.as_object().is_some_and(Map::is_empty) {
                bail!("nothing to change: give --set KEY=VALUE or --file PATCH.json");
            }
            let (version, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            let (_, m) = api
                .send(
                    api.req(Method::PATCH, &format!("/machines/{id}"))
                        .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
                        .json(&patch),
                )
                .await?;
            emit(args.json, &m, print_machine);
        }
        MachineCommand::Inspect { machine } => {
            crate::cli_bmc::inspect(&api, &machine, args.json).await?;
        }
        MachineCommand::State {
            machine,
            state,
            reason,
        } => {
            let (version, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            let (_, m) = api
                .send(
                    api.req(Method::POST, &format!("/machines/{id}/state"))
                        .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
                        .json(&json!({"state": state, "reason": reason})),
                )
                .await?;
            emit(args.json, &m, print_machine);
        }
        MachineCommand::Provision {
            machine,
            ttl,
            wipe,
            close,
        } => {
            let (_, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            if close {
                api.send(api.req(Method::DELETE, &format!("/machines/{id}/provision")))
                    .await?;
                say(format!("{machine}: provisioning window closed"));
            } else {
                let (_, w) = api
                    .send(
                        api.req(Method::POST, &format!("/machines/{id}/provision"))
                            .json(&json!({"ttl_seconds": ttl, "wipe": wipe})),
                    )
                    .await?;
                if args.json {
                    say(&w);
                } else {
                    for warning in w["warnings"].as_array().into_iter().flatten() {
                        eprintln!("warning: {}", s(warning));
                    }
                    say(format!(
                        "{machine}: provisioning window open until {}; config sha256 {}; network-boot the machine to install",
                        s(&w["window"]["expires_at"]),
                        s(&w["sha256"])
                    ));
                }
            }
        }
        MachineCommand::Reinstall {
            machine,
            wipe,
            follow,
        } => {
            let (_, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            let stream = if follow {
                Some(open_event_stream(&api, Some(&id), Some("reinstall.")).await?)
            } else {
                None
            };
            let (_, started) = api
                .send(
                    api.req(Method::POST, &format!("/machines/{id}/reinstall"))
                        .json(&json!({"wipe": wipe})),
                )
                .await?;
            if args.json {
                say(&started);
            } else {
                say(format!(
                    "{machine}: reinstall started; {}",
                    s(&started["next"])
                ));
            }
            if let Some(stream) = stream {
                print_event_stream(stream, true).await?;
            }
        }
        MachineCommand::Events {
            machine,
            kind,
            follow,
        } => {
            let id = match &machine {
                Some(m) => Some(s(&api.get_machine(m).await?.1["id"])),
                None => None,
            };
            if follow {
                follow_events(&api, id.as_deref(), kind.as_deref(), false).await?;
            } else {
                let mut q = vec![];
                if let Some(i) = &id {
                    q.push(format!("machine={i}"));
                }
                if let Some(k) = &kind {
                    q.push(format!("kind={}", urlencode(k)));
                }
                let (_, list) = api
                    .send(api.req(Method::GET, &format!("/events?{}", q.join("&"))))
                    .await?;
                for e in list.as_array().into_iter().flatten() {
                    print_event(args.json, e);
                }
            }
        }
        MachineCommand::Config { machine } => {
            let (_, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            let (_, c) = api
                .send(api.req(Method::GET, &format!("/machines/{id}/config")))
                .await?;
            if args.json {
                say(&c);
            } else {
                say(format!(
                    "valid: {}\nsha256: {}\ntalos: {}\ninstall disk: {}\nwindow open: {}\nlast served: {} {}",
                    c["valid"],
                    s(&c["sha256"]),
                    s(&c["talos_version"]),
                    s(&c["install_disk"]),
                    c["window_open"],
                    s(&c["served_sha256"]),
                    s(&c["served_at"])
                ));
                if let Some(e) = c["error"].as_str() {
                    say(format!("error: {e}"));
                }
                for w in c["warnings"].as_array().into_iter().flatten() {
                    say(format!("warning: {}", s(w)));
                }
            }
        }
        MachineCommand::Rm { machine } => {
            let (version, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            api.send(
                api.req(Method::DELETE, &format!("/machines/{id}"))
                    .header(reqwest::header::IF_MATCH, format!("\"{version}\"")),
            )
            .await?;
            if args.json {
                say(json!({"removed": id}));
            } else {
                say(format!("removed {} ({id})", s(&m["hostname"])));
            }
        }
        MachineCommand::Import { file, format } => {
            let text =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let format = match format {
                Some(f) => f,
                None => match file.extension().and_then(|e| e.to_str()) {
                    Some("csv") => "csv".into(),
                    Some("json") => "json".into(),
                    _ => bail!(
                        "cannot tell the format of {}: give --format csv|json",
                        file.display()
                    ),
                },
            };
            let ct = if format == "csv" {
                "text/csv"
            } else {
                "application/json"
            };
            let (_, r) = api
                .send(
                    api.req(Method::POST, "/machines/import")
                        .query(&[("format", &format)])
                        .header(reqwest::header::CONTENT_TYPE, ct)
                        .body(text),
                )
                .await?;
            if args.json {
                say(&r);
            } else {
                say(format!("imported {} machine(s)", r["imported"]));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_patch_nests_and_clears() {
        let p = set_patch(&[
            "rack=r1".into(),
            "rack_unit=7".into(),
            "bmc.url=https://x".into(),
            "serial=".into(),
        ])
        .expect("patch");
        assert_eq!(
            p,
            json!({"rack": "r1", "rack_unit": 7, "bmc": {"url": "https://x"}, "serial": null})
        );
        assert!(set_patch(&["novalue".into()]).is_err());
    }
}

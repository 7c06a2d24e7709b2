//! Wiring: the only place that names concrete types. Opens the store, loads the secret key, binds
//! the sockets, and runs the front doors under one cancellation token. `spawn` returns the bound
//! addresses, used by `main` and by tests alike.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, DhcpConfig, SecretKeySource, SECRET_KEY_ENV};
use crate::http::{self, AppState};
use crate::metrics::AtomicHistogram;
use crate::service::ports::{CommitObserver, CommitReport, Stores};
use crate::service::provisioning::dhcp::{DhcpService, LeaseTiming};
use crate::service::provisioning::timeline::Timeline;
use crate::service::provisioning::{
    BootFiles, BootSettings, Identities, ImagesDoor, Parts, ProvisioningService,
};
use crate::service::{BmcService, ConfigService, Inventory, SecretBox, Tokens, Workflows};
use crate::store::{self, StoreOptions};

/// A running server.
pub struct Running {
    /// Where the HTTP front door listens.
    pub http_addr: SocketAddr,
    /// Where DHCP listens (`interface:port`), empty when off.
    pub dhcp: Vec<String>,
    /// Where TFTP listens, when on.
    pub tftp_addr: Option<SocketAddr>,
    /// Where the image door (`/images/` with sendfile) listens, when on.
    pub images_addr: Option<SocketAddr>,
    /// Architectures the iPXE binaries found can boot (e.g. `bios`, `uefi-x86_64`).
    pub bootable: Vec<String>,
    /// Cancel to shut everything down.
    pub shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
}

impl Running {
    /// Wait until every task ends (after `shutdown` is cancelled, or on the first failure).
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut result = Ok(());
        while let Some(done) = self.tasks.join_next().await {
            let r = done.map_err(anyhow::Error::from).and_then(|r| r);
            if let Err(e) = r {
                self.shutdown.cancel();
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    }

    /// Cancel and wait.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.wait().await
    }
}

/// Open the configured store, creating the data directory for SQLite: one handle per port.
pub async fn open_store(config: &Config, migrate: bool) -> anyhow::Result<Stores> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data directory {}", config.data_dir.display()))?;
    open_store_in_place(config, migrate).await
}

/// Open the configured store without creating the data directory, migrating when asked: for
/// commands that only read (no migration; the caller first checks that a SQLite file exists, so
/// none is created either) and for migrating a PostgreSQL database, which needs no data
/// directory.
pub async fn open_store_in_place(config: &Config, migrate: bool) -> anyhow::Result<Stores> {
    let opts = StoreOptions {
        url: config.database_url.clone(),
        max_connections: config.max_connections,
        migrate,
    };
    store::open(&opts).await.with_context(|| {
        format!(
            "cannot open database {}",
            store::redact_url(&config.database_url)
        )
    })
}

/// The inventory use case over its ports of `stores`.
pub fn inventory(stores: &Stores, secrets: SecretBox) -> Inventory {
    Inventory::new(
        stores.machines.clone(),
        stores.events.clone(),
        stores.configs.clone(),
        stores.health.clone(),
        secrets,
    )
}

/// The machine-config use case over its ports of `stores`.
pub fn config_service(
    stores: &Stores,
    secrets: SecretBox,
    schema_dir: Option<std::path::PathBuf>,
) -> ConfigService {
    ConfigService::new(
        stores.configs.clone(),
        stores.events.clone(),
        stores.leases.clone(),
        secrets,
        schema_dir,
    )
}

/// The API-token use case over its ports of `stores`.
pub fn tokens(stores: &Stores) -> Tokens {
    Tokens::new(stores.tokens.clone(), stores.events.clone())
}

/// The BMC use case over the inventory, its ports of `stores`, and `connector` to reach BMCs.
pub fn bmc_service(
    inventory: &Inventory,
    stores: &Stores,
    connector: Arc<dyn crate::service::BmcConnector>,
) -> BmcService {
    BmcService::new(
        inventory.clone(),
        stores.bmc_capabilities.clone(),
        connector,
    )
}

/// A BMC connector for `plinth doctor`: one try per request, `timeout` to connect and to answer,
/// so that an unreachable BMC costs seconds, not the minutes a power action may wait.
pub fn bmc_connector_for_checks(
    timeout: std::time::Duration,
) -> Arc<dyn crate::service::BmcConnector> {
    Arc::new(crate::bmc::RedfishConnector {
        options: crate::bmc::BmcOptions {
            request_timeout: timeout,
            connect_timeout: timeout,
            max_retries: 0,
            ..Default::default()
        },
    })
}

/// The cluster use cases (the Talos API) over their ports of `stores` and a Talos API client.
pub fn clusters(
    configs: &ConfigService,
    stores: &Stores,
    api: Arc<dyn crate::service::ports::talos_api::TalosApi>,
    settings: crate::service::clusters::ClusterSettings,
) -> crate::service::clusters::Clusters {
    crate::service::clusters::Clusters::new(
        stores.machines.clone(),
        stores.events.clone(),
        stores.talos.clone(),
        configs.clone(),
        api,
        settings,
    )
}

/// The upgrade use case over the cluster use cases, its port of `stores` and where etcd
/// snapshots are found.
pub fn upgrades(
    clusters: &crate::service::clusters::Clusters,
    stores: &Stores,
    snapshots: Arc<dyn crate::service::upgrade::SnapshotCheck>,
    settings: crate::service::UpgradeSettings,
) -> crate::service::Upgrades {
    crate::service::Upgrades::new(
        clusters.clone(),
        stores.upgrades.clone(),
        snapshots,
        settings,
    )
}

/// The etcd snapshot and recovery use cases over the cluster use cases, their ports of
/// `stores`, the object stores the configuration reaches, and the secret key.
pub fn snapshots(
    clusters: &crate::service::clusters::Clusters,
    stores: &Stores,
    s3: crate::service::ports::snapshots::S3Settings,
    secrets: SecretBox,
    settings: crate::service::snapshots::SnapshotSettings,
) -> crate::service::snapshots::Snapshots {
    crate::service::snapshots::Snapshots::new(
        clusters.clone(),
        stores.snapshots.clone(),
        stores.events.clone(),
        Arc::new(crate::objects::Stores::new(s3)),
        secrets,
        settings,
    )
}

/// The workflow use case over the other use cases and its ports of `stores`.
pub fn workflows(
    inventory: &Inventory,
    configs: &ConfigService,
    bmc: &BmcService,
    stores: &Stores,
    clusters: crate::service::clusters::Clusters,
    settings: crate::service::WorkflowSettings,
) -> Workflows {
    Workflows::new(
        inventory.clone(),
        configs.clone(),
        bmc.clone(),
        stores.reinstalls.clone(),
        stores.events.clone(),
        clusters,
        stores.upgrades.clone(),
        settings,
    )
}

/// Load the secret key from the environment, the key file, or the data directory, without looking
/// at the database: a key file readable by group or others, or a missing one, is refused (only
/// `checked_secret_box` creates a key, and only over a database that holds nothing sealed).
pub fn secret_box(config: &Config) -> anyhow::Result<SecretBox> {
    match load_key(config.require_secret_key()?)? {
        Some(sb) => Ok(sb),
        None => Err(missing_key(config, None)),
    }
}

/// The secret key, checked against the fingerprint the database records (`StoreHealth`): a key
/// that does not match (a wrong key, or another instance's on a shared PostgreSQL) is refused, and
/// so is a missing data-directory key over a database that holds sealed values or a fingerprint.
/// Only over a database with neither is a missing data-directory key created (mode 0600). With
/// `record`, a database without a fingerprint gets this key's; without it (commands that only
/// read) nothing is written.
pub async fn checked_secret_box(
    config: &Config,
    stores: &Stores,
    record: bool,
) -> anyhow::Result<SecretBox> {
    let source = config.require_secret_key()?;
    let health = &stores.health;
    let on_record = health
        .key_fingerprint()
        .await
        .context("cannot read the secret key's fingerprint from the database")?;
    let sb = match load_key(source)? {
        Some(sb) => sb,
        None => {
            let sealed = health
                .holds_sealed_values()
                .await
                .context("cannot check the database for sealed values")?;
            if on_record.is_some() || sealed || !record {
                return Err(missing_key(config, on_record.as_deref()));
            }
            let SecretKeySource::DataDir(p) = source else {
                return Err(missing_key(config, None));
            };
            let key = SecretBox::generate_key_text();
            write_private(p, &key)
                .with_context(|| format!("cannot create secret key {}", p.display()))?;
            tracing::info!(path = %p.display(), "generated a new secret key; back it up: without it stored secrets cannot be read");
            SecretBox::from_text(&key).context("secret key")?
        }
    };
    let expected = match on_record {
        Some(f) => Some(f),
        None if record => Some(
            health
                .claim_key_fingerprint(sb.fingerprint())
                .await
                .context("cannot record the secret key's fingerprint in the database")?,
        ),
        None => None,
    };
    if let Some(expected) = expected {
        if expected != sb.fingerprint() {
            anyhow::bail!(
                "the secret key from {} is not the key this database's secrets are sealed with \
                 (database {}: key fingerprint {}…, this key {}…): every instance sharing a database \
                 must use the same key; restore the original key (from your backup) rather than \
                 making a new one, which would leave every stored secret unreadable",
                describe_source(source),
                store::redact_url(&config.database_url),
                short(&expected),
                short(sb.fingerprint())
            );
        }
    }
    Ok(sb)
}

/// The first 16 hex digits of a fingerprint, for messages.
fn short(fingerprint: &str) -> &str {
    fingerprint.get(..16).unwrap_or(fingerprint)
}

/// Where a key comes from, for messages.
fn describe_source(source: &SecretKeySource) -> String {
    match source {
        SecretKeySource::Env => SECRET_KEY_ENV.to_string(),
        SecretKeySource::File(p) => format!("secrets.key_file {}", p.display()),
        SecretKeySource::DataDir(p) => p.display().to_string(),
    }
}

/// The refusal for a missing data-directory key.
fn missing_key(config: &Config, on_record: Option<&str>) -> anyhow::Error {
    let path = match config.secret_key.as_ref() {
        Some(s) => describe_source(s),
        None => "secrets.key_file".into(),
    };
    let database = store::redact_url(&config.database_url);
    match on_record {
        Some(fp) => anyhow::anyhow!(
            "no secret key at {path}, but the database {database} holds secrets sealed with a key \
             (fingerprint {}…): restore that key file from your backup; Plinth does not make a new \
             key over sealed secrets, which would leave them unreadable",
            short(fp)
        ),
        None => anyhow::anyhow!(
            "no secret key at {path}: restore the key file from your backup (the database \
             {database} may hold secrets sealed with it), or start `plinth serve` once over an \
             empty database to create one"
        ),
    }
}

/// The key of `source`; `None` when the data-directory key does not exist. A key file (given or
/// in the data directory) that group or others may read is refused with the fix.
fn load_key(source: &SecretKeySource) -> anyhow::Result<Option<SecretBox>> {
    let text = match source {
        SecretKeySource::Env => std::env::var(SECRET_KEY_ENV)
            .with_context(|| format!("{SECRET_KEY_ENV} is not valid UTF-8"))?,
        SecretKeySource::File(p) => {
            check_private(p, "secrets.key_file")?;
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read secrets.key_file {}", p.display()))?
        }
        SecretKeySource::DataDir(p) => match std::fs::metadata(p) {
            Ok(_) => {
                check_private(p, "the secret key")?;
                std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read secret key {}", p.display()))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read secret key {}", p.display()))
            }
        },
    };
    SecretBox::from_text(&text)
        .map(Some)
        .with_context(|| format!("secret key from {}", describe_source(source)))
}

/// Refuse a key file that group or others may read (or write).
fn check_private(path: &std::path::Path, what: &str) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path)
            .with_context(|| format!("cannot read {what} {}", path.display()))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "{what} {} has mode {mode:04o}: group and others must not read a secret key; \
                 run `chmod 600 {}`",
                path.display(),
                path.display()
            );
        }
    }
    Ok(())
}

fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

/// Bind the DHCP sockets a configuration asks for (before anything is served).
/// Raw ICMPv6 sockets for the router advertisements of subnets with `ipv6_ra`, one per link
/// DHCP serves that holds such a subnet's address.
fn bind_ra(d: &DhcpConfig) -> anyhow::Result<Vec<(crate::dhcp::ra::RaLink, socket2::Socket)>> {
    let links = crate::dhcp::ra::links(&d.subnets, &d.interfaces);
    for s in d.subnets.iter().filter(|s| s.router_advert.is_some()) {
        if !links.is_empty() || !s.relay_agents.is_empty() {
            continue;
        }
        tracing::warn!(subnet = %s.net, "ipv6_ra: no interface DHCP serves holds an address of this subnet: no router advertisements are sent for it");
    }
    links
        .into_iter()
        .map(|l| {
            let s = crate::dhcp::ra::bind(&l).map_err(|e| {
                anyhow::anyhow!(
                    "cannot open a raw ICMPv6 socket on {} for router advertisements \
                     (dhcp.subnet ipv6_ra; needs root or CAP_NET_RAW, and IPv6 on the interface): {e}",
                    l.interface
                )
            })?;
            Ok((l, s))
        })
        .collect()
}

fn bind_dhcp(d: &DhcpConfig) -> anyhow::Result<Vec<crate::dhcp::DhcpSocket>> {
    let ifaces: Vec<Option<&str>> = if d.interfaces.is_empty() {
        vec![None]
    } else {
        d.interfaces.iter().map(|i| Some(i.as_str())).collect()
    };
    let mut out = Vec::new();
    for iface in ifaces {
        for (port, proxy) in std::iter::once((d.port, false)).chain(d.proxy_port.map(|p| (p, true)))
        {
            let s = crate::dhcp::bind(port, iface, proxy).map_err(|e| {
                let on = iface.map(|i| format!(" on {i}")).unwrap_or_default();
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    anyhow::anyhow!(
                        "cannot bind DHCP UDP port {port}{on}: binding ports below 1024 (and to an interface) needs root or \
                         CAP_NET_BIND_SERVICE and CAP_NET_RAW: run as root, or `setcap cap_net_bind_service,cap_net_raw=+ep $(command -v plinth)`"
                    )
                } else {
                    anyhow::anyhow!("cannot bind DHCP UDP port {port}{on} (dhcp.port / dhcp.proxy_port / dhcp.interfaces): {e}")
                }
            })?;
            out.push(s);
        }
    }
    Ok(out)
}

/// Raise this process's soft `RLIMIT_NOFILE` to its hard limit (capped at [`MAX_NOFILE`]), and
/// return the soft limit in force. Hundreds of machines booting at once each hold a connection or
/// a transfer; the usual soft limit of 1,024 is reached long before the hard one.
pub fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            let want = hard.min(MAX_NOFILE);
            if soft < want {
                match setrlimit(Resource::RLIMIT_NOFILE, want, hard) {
                    Ok(()) => return want,
                    Err(e) => {
                        tracing::warn!(error = %e, soft, hard, "cannot raise the descriptor limit")
                    }
                }
            }
            soft
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the descriptor limit; assuming 1024");
            1024
        }
    }
}

/// The highest descriptor limit asked for (the kernel's usual `nr_open`).
pub const MAX_NOFILE: u64 = 1 << 20;

/// Descriptors kept out of every front door's reach: the database pool (three per SQLite
/// connection: the file, its WAL and its shared memory; one per PostgreSQL connection), and this
/// many more for listening sockets, DHCP sockets, the log, BMC and Talos API clients and files the
/// service opens.
pub const RESERVED_DESCRIPTORS: u64 = 128;

/// How many connections or transfers each front door may hold, so that together they never
/// take the descriptors the database and the rest of the server need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescriptorBudget {
    /// Connections on the main port.
    pub http: usize,
    /// Connections on the image door.
    pub images: usize,
    /// TFTP transfers.
    pub tftp: usize,
}

impl DescriptorBudget {
    /// Split `nofile` descriptors: first the reserve (the database's `db_connections`, `sqlite`
    /// or not, and [`RESERVED_DESCRIPTORS`]), then two fifths each to the main port and the image
    /// door and one fifth to TFTP, counting two descriptors per connection or transfer (its
    /// socket and the file it serves); each door is also capped by `max` (its own setting).
    pub fn split(nofile: u64, db_connections: u32, sqlite: bool, max: DescriptorBudget) -> Self {
        let per_db = if sqlite { 3 } else { 1 };
        let reserve = RESERVED_DESCRIPTORS + u64::from(db_connections) * per_db;
        let free = nofile.saturating_sub(reserve);
        let share = |fifths: u64, cap: usize| {
            usize::try_from(free * fifths / 5 / 2)
                .unwrap_or(usize::MAX)
                .clamp(1, cap.max(1))
        };
        DescriptorBudget {
            http: share(2, max.http),
            images: share(2, max.images),
            tftp: share(1, max.tftp),
        }
    }

    /// A client's share of a door's `cap`: a quarter at most (at least one), so that one client
    /// cannot hold a door alone.
    pub fn per_client(&self, cap: usize) -> usize {
        (cap / 4).max(1)
    }
}

/// Run the front door `serve` makes on a Tokio runtime of its own (`workers` threads, driven from
/// an OS thread of its own), and return its result as a future for the main runtime's task set. DHCP and TFTP run so: they answer small packets on the firmware's
/// retransmission timers (DHCP 4 s, TFTP a few seconds a block), and on the main runtime a boot
/// storm queues them behind the HTTP work of streaming images to hundreds of machines. Their mostly
/// idle threads are scheduled by the kernel as soon as a packet arrives, whatever the HTTP side is
/// doing. Sockets given to `serve` as std sockets join its runtime inside it.
fn on_own_runtime<F, Fut>(
    name: &str,
    workers: usize,
    serve: F,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(format!("{name}-worker"))
        .enable_all()
        .build()
        .with_context(|| format!("cannot start the {name} runtime"))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread = name.to_string();
    std::thread::Builder::new()
        .name(thread.clone())
        .spawn(move || {
            let r = rt.block_on(serve());
            // Work still running (a decision, a transfer) ends with the runtime; clients retry.
            rt.shutdown_background();
            let _ = tx.send(r);
        })
        .with_context(|| format!("cannot start the {name} thread"))?;
    Ok(async move {
        rx.await.unwrap_or_else(|_| {
            Err(anyhow::anyhow!(
                "the {thread} thread ended without a result"
            ))
        })
    })
}

/// The store's group commit in `/metrics` (the observer is called on the writer's task after
/// each transaction: atomics only).
struct CommitMetrics {
    writes: AtomicHistogram,
    waited: AtomicHistogram,
    took: AtomicHistogram,
    commits: prometheus_client::metrics::counter::Counter,
    rollbacks: prometheus_client::metrics::counter::Counter,
    queued: prometheus_client::metrics::gauge::Gauge,
}

impl CommitMetrics {
    fn register(metrics: &crate::metrics::Metrics) -> Self {
        let m = CommitMetrics {
            writes: AtomicHistogram::sizes(),
            waited: AtomicHistogram::seconds(),
            took: AtomicHistogram::seconds(),
            commits: Default::default(),
            rollbacks: Default::default(),
            queued: Default::default(),
        };
        metrics.register(
            "store_commit_writes",
            "Writes per group-commit transaction (DHCP leases, boot events, config tokens)",
            m.writes.clone(),
        );
        metrics.register(
            "store_commit_wait_seconds",
            "Time the first write of a group-commit transaction waited in the queue",
            m.waited.clone(),
        );
        metrics.register(
            "store_commit_seconds",
            "Time of a group-commit transaction, begin to durable commit",
            m.took.clone(),
        );
        metrics.register(
            "store_commits",
            "Group-commit transactions committed: one fsync of the WAL each on SQLite \
             (synchronous=FULL), one commit on PostgreSQL; its rate is the fsyncs per second",
            m.commits.clone(),
        );
        metrics.register(
            "store_commit_rollbacks",
            "Group-commit transactions rolled back (their writes then retried one by one)",
            m.rollbacks.clone(),
        );
        metrics.register(
            "store_commit_queued",
            "Writes queued for the group commit after its last transaction",
            m.queued.clone(),
        );
        m
    }
}

impl CommitObserver for CommitMetrics {
    fn transaction(&self, r: CommitReport) {
        self.writes.observe_units(r.writes as u64);
        self.waited.observe_duration(r.waited);
        self.took.observe_duration(r.took);
        if r.committed {
            self.commits.inc();
        } else {
            self.rollbacks.inc();
        }
        self.queued.set(i64::try_from(r.queued).unwrap_or(i64::MAX));
    }
}

/// Open everything and start serving.
pub async fn spawn(config: &Config) -> anyhow::Result<Running> {
    let stores = open_store(config, true).await?;
    checked_secret_box(config, &stores, true).await?;
    spawn_with_stores(config, stores).await
}

/// Start serving over stores already opened: `spawn` after it opened the configured database and
/// checked the secret key against it, and tests that serve over another implementation of the
/// ports (a store that fails).
pub async fn spawn_with_stores(config: &Config, stores: Stores) -> anyhow::Result<Running> {
    let secrets = secret_box(config)?;
    let nofile = raise_nofile();
    let main_limits = http::serve::Limits::default();
    let images_limits = http::images_listener::Limits::default();
    let tftp_defaults = crate::tftp::TftpOptions::default();
    let budget = DescriptorBudget::split(
        nofile,
        config.max_connections,
        config.database_url.starts_with("sqlite:"),
        DescriptorBudget {
            http: main_limits.max_connections,
            images: images_limits.max_connections,
            tftp: tftp_defaults.max_transfers,
        },
    );
    tracing::info!(
        descriptors = nofile,
        http_connections = budget.http,
        image_connections = budget.images,
        tftp_transfers = budget.tftp,
        "descriptor budget"
    );
    let dhcp_sockets = match &config.dhcp {
        Some(d) => bind_dhcp(d)?,
        None => Vec::new(),
    };
    let ra_sockets = match &config.dhcp {
        Some(d) => bind_ra(d)?,
        None => Vec::new(),
    };
    let tftp_socket = match &config.tftp {
        Some(t) => Some(std::net::UdpSocket::bind(t.listen).map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                anyhow::anyhow!(
                    "cannot bind TFTP {}: ports below 1024 need root or CAP_NET_BIND_SERVICE \
                     (`setcap cap_net_bind_service=+ep $(command -v plinth)`)",
                    t.listen
                )
            } else {
                anyhow::anyhow!("cannot bind TFTP {} (tftp.listen): {e}", t.listen)
            }
        })?),
        None => None,
    };
    let tftp_addr = tftp_socket.as_ref().and_then(|s| s.local_addr().ok());
    let listener = tokio::net::TcpListener::bind(config.http_listen)
        .await
        .with_context(|| format!("cannot listen on {} (http.listen)", config.http_listen))?;
    let http_addr = listener.local_addr()?;
    let images_listener = match config.images_listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot listen on {a} (boot.images_listen)"))?,
        ),
        None => None,
    };
    let images_addr = match &images_listener {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    let metrics = Arc::new(crate::metrics::Metrics::new());
    stores
        .health
        .observe_commits(Arc::new(CommitMetrics::register(&metrics)));
    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let identities = Identities::new(stores.machines.clone(), stores.leases.clone());
    identities.register(&metrics);
    let timeline = Timeline::start(stores.events.clone(), identities.clone(), shutdown.clone());
    timeline.register(&metrics);
    if let Some(d) = &config.dhcp {
        if config.tftp.is_none() {
            tracing::warn!("TFTP is off: PXE firmware is still offered iPXE over TFTP from this server and will time out before its next boot option; UEFI HTTP boot and iPXE clients are served over HTTP");
        }
        for s in crate::domain::dhcp::unresolvable_http_boot(&d.boot_url, &d.subnets) {
            tracing::warn!(subnet = %s.net, boot_url = %d.boot_url,
                "UEFI HTTP boot clients of this subnet cannot resolve the boot URL's host name: give the subnet `dns` servers, or make [boot] public_url an IPv4 address");
        }
    }
    let dhcp_engine = config.dhcp.as_ref().map(|d| {
        Arc::new(
            DhcpService::new(
                stores.leases.clone(),
                d.subnets.clone(),
                crate::domain::dhcp::BootFiles {
                    http_base: d.boot_url.clone(),
                },
                LeaseTiming {
                    offer_ms: i64::from(d.offer_seconds) * 1000,
                    decline_ms: i64::from(d.decline_seconds) * 1000,
                },
            )
            .with_timeline(timeline.clone()),
        )
    });
    let secrets_for_configs = secrets.clone();
    let secrets_for_snapshots = secrets.clone();
    let inventory = inventory(&stores, secrets);
    // Before the API serves: BMC passwords sealed before they were bound to their BMC's origin.
    // A store fault here does not keep the server down (a store fault is a 5xx or a 503, and the
    // database answered `open_store` a moment ago): a password not re-sealed stays refused, never
    // used the old way, and the next start re-seals it.
    if let Err(e) = inventory.reseal_bmc_passwords("plinth").await {
        tracing::error!(error = %e, "cannot re-seal stored BMC passwords for their BMC's origin; \
            those not re-sealed stay unusable until the next start");
    }
    let bmc = bmc_service(
        &inventory,
        &stores,
        Arc::new(crate::bmc::RedfishConnector::default()),
    );
    let configs = config_service(
        &stores,
        secrets_for_configs,
        config.talos_schema_dir.clone(),
    );
    configs.register(&metrics);
    let images = crate::images::ImageDepot::new(
        crate::images::ImageCache::new(config.data_dir.join("images")),
        match &config.image_factory {
            Some(f) => Some(crate::images::ImagePuller::new(
                crate::images::ImageCache::new(config.data_dir.join("images")),
                f,
            )?),
            None => None,
        },
    );
    let provisioning = ProvisioningService::new(Parts {
        inventory: inventory.clone(),
        configs: configs.clone(),
        events: stores.events.clone(),
        identities,
        timeline,
        images: Arc::new(images),
        files: BootFiles::new(Some(config.ipxe_dir.clone())),
        dhcp: dhcp_engine,
        settings: BootSettings {
            public_url: config.boot_public_url.clone(),
            images_door: match (&config.images_url, images_addr) {
                (Some(u), _) => ImagesDoor::Url(u.clone()),
                (None, Some(a)) => ImagesDoor::Port(a.port()),
                (None, None) => ImagesDoor::Main,
            },
        },
    });
    let mut dhcp = Vec::new();
    if let Some(d) = &config.dhcp {
        if config.tftp.is_none() {
            tracing::warn!("TFTP is off: PXE firmware is still offered iPXE over TFTP from this server and will time out before its next boot option; UEFI HTTP boot and iPXE clients are served over HTTP");
        }
        for s in &dhcp_sockets {
            let port = s.socket.local_addr().map(|a| a.port()).unwrap_or(0);
            dhcp.push(format!("{}:{port}", s.interface.as_deref().unwrap_or("*")));
        }
        let m = crate::dhcp::DhcpMetrics::register(&metrics);
        let (stop, service) = (shutdown.clone(), provisioning.clone());
        let per_second = f64::from(d.unknown_clients_per_second);
        let rates = crate::dhcp::Rates {
            unknown: per_second,
            unknown_burst: 2.0 * per_second,
            ..Default::default()
        };
        let done = on_own_runtime("plinth-dhcp", 2, move || {
            crate::dhcp::serve(dhcp_sockets, service, m, rates, stop)
        })?;
        tasks.spawn(done);
    }
    if !ra_sockets.is_empty() {
        let (m, stop) = (
            crate::dhcp::ra::RaMetrics::register(&metrics),
            shutdown.clone(),
        );
        tasks.spawn(async move { crate::dhcp::ra::serve(ra_sockets, m, stop).await });
    }
    if let (Some(sock), Some(t)) = (tftp_socket, &config.tftp) {
        let opts = crate::tftp::TftpOptions {
            max_block_size: t.max_block_size,
            max_window_size: t.max_window_size,
            max_transfers: budget.tftp,
            max_per_client: tftp_defaults
                .max_per_client
                .min(budget.per_client(budget.tftp)),
        };
        let (service, m, stop) = (provisioning.clone(), metrics.clone(), shutdown.clone());
        let done = on_own_runtime("plinth-tftp", 2, move || {
            crate::tftp::serve(sock, service, opts, m, stop)
        })?;
        tasks.spawn(done);
    }
    let bootable = provisioning.bootable();
    let clusters = clusters(
        &configs,
        &stores,
        Arc::new(crate::talos_api::TalosApiClient::default()),
        crate::service::clusters::ClusterSettings {
            talos_api_port: config.workflows.talos_api_port,
            ..Default::default()
        },
    );
    clusters.register_metrics(&metrics);
    let snapshots = snapshots(
        &clusters,
        &stores,
        config.snapshot_s3.clone(),
        secrets_for_snapshots,
        crate::service::snapshots::SnapshotSettings {
            instance: clusters.settings().instance.clone(),
            turn: config.snapshot_turn,
            ..Default::default()
        },
    );
    snapshots.register_metrics(&metrics);
    {
        // The snapshot schedule: its own task, so a long snapshot never holds up reinstalls.
        let (sn, stop, every) = (snapshots.clone(), shutdown.clone(), config.snapshot_tick);
        let turn = config.snapshot_turn.to_std().unwrap_or_default();
        tasks.spawn(async move {
            // Snapshots an instance that stopped left `taking`: failed and cleaned up, as soon
            // as their cluster's turn can be claimed (a dead holder's expires after `turn`).
            for _ in 0..10 {
                let pause = match sn.clean_up_interrupted().await {
                    Ok(0) => break,
                    Ok(_) => turn / 2,
                    Err(e) => {
                        tracing::warn!(error = %e, "etcd snapshots: cannot clean up interrupted snapshots yet");
                        turn / 2
                    }
                };
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(pause.max(std::time::Duration::from_secs(1))) => {}
                }
            }
            // The first look one period after start: a restart is no reason for a snapshot.
            let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = interval.tick() => {
                        tokio::select! {
                            _ = stop.cancelled() => return Ok(()),
                            r = sn.tick() => if let Err(e) = r {
                                tracing::warn!(error = %e, "etcd snapshot schedule: tick failed");
                            },
                        }
                    }
                }
            }
        });
    }
    let upgrades = upgrades(
        &clusters,
        &stores,
        Arc::new(snapshots.clone()),
        config.upgrades.clone(),
    );
    tasks.spawn({
        let (u, stop) = (upgrades.clone(), shutdown.clone());
        async move {
            u.run(stop).await;
            Ok(())
        }
    });
    let workflows = workflows(
        &inventory,
        &configs,
        &bmc,
        &stores,
        clusters,
        config.workflows.clone(),
    );
    {
        let (w, stop, every) = (workflows.clone(), shutdown.clone(), config.workflow_tick);
        tasks.spawn(async move {
            let mut interval = tokio::time::interval(every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = interval.tick() => {
                        if let Err(e) = w.tick().await {
                            tracing::warn!(error = %e, "workflow engine: tick failed");
                        }
                    }
                }
            }
        });
    }
    let state = AppState {
        snapshots,
        shutdown: shutdown.clone(),
        workflows,
        upgrades,
        configs,
        inventory,
        tokens: tokens(&stores),
        bmc,
        metrics,
        max_body_bytes: config.max_body_bytes,
        provisioning,
        events: crate::service::EventFeed::new(stores.events.clone(), stores.tokens.clone()),
        secure_cookies: config
            .boot_public_url
            .as_deref()
            .is_some_and(|u| u.to_ascii_lowercase().starts_with("https://")),
    };
    if let Some(l) = images_listener {
        let (st, stop) = (state.clone(), shutdown.clone());
        let limits = http::images_listener::Limits {
            max_connections: budget.images,
            max_per_client: images_limits
                .max_per_client
                .min(budget.per_client(budget.images)),
            ..images_limits
        };
        tasks.spawn(async move {
            http::images_listener::serve(l, st, limits, stop)
                .await
                .context("image door")
        });
    }
    let http_metrics = state.metrics.clone();
    let router = http::router(state);
    let stop = shutdown.clone();
    let limits = http::serve::Limits {
        max_connections: budget.http,
        max_per_client: main_limits
            .max_per_client
            .min(budget.per_client(budget.http)),
        ..main_limits
    };
    tasks.spawn(async move {
        http::serve::serve(listener, router, limits, http_metrics, stop)
            .await
            .context("HTTP server")
    });
    Ok(Running {
        http_addr,
        dhcp,
        tftp_addr,
        images_addr,
        bootable,
        shutdown,
        tasks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: DescriptorBudget = DescriptorBudget {
        http: 1024,
        images: 1024,
        tftp: 256,
    };

    #[test]
    fn the_budget_keeps_the_reserve_out_of_the_front_doors_reach() {
        for (nofile, db, sqlite) in [(256u64, 8u32, true), (1024, 8, true), (1024, 64, false)] {
            let b = DescriptorBudget::split(nofile, db, sqlite, MAX);
            let used = 2 * (b.http + b.images + b.tftp) as u64;
            let reserve = RESERVED_DESCRIPTORS + u64::from(db) * if sqlite { 3 } else { 1 };
            assert!(used + reserve <= nofile, "{nofile}: {b:?}");
            assert!(b.http >= 1 && b.images >= 1 && b.tftp >= 1);
        }
        assert_eq!(DescriptorBudget::split(1 << 20, 8, true, MAX), MAX);
    }
}

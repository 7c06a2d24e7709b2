//! The TFTP front door (RFC 1350; options RFC 2347, blksize RFC 2348, timeout and tsize RFC 2349,
//! windowsize RFC 7440): read-only. Which file a read request gets (a name inside the iPXE
//! directory, never `..`, a path or symlink out of it, or a non-file) and the `tftp.read` step of
//! the boot timeline are the provisioning service's answer; this door decodes the request, asks
//! it, and sends the file or a TFTP error packet. Every write request is refused.
//!
//! Each read is a tokio task with its own socket (the transfer identifier), connected to the
//! client, waiting for ACKs with one retransmission timer per transfer. Transfers under way are
//! capped in all and per client address. A read request past a cap waits for a transfer to end
//! instead of being dropped (a client such as curl retransmits its request only after seconds,
//! and many clients behind one NAT or one test host share an address), but waiting is bounded
//! too: no more requests wait than may run ([`TftpOptions::max_transfers`]), at most
//! [`MAX_WAITING_PER_CLIENT`] per address, each at most [`MAX_WAIT`]; past that a request is
//! dropped (counted as `busy`) before any socket or task exists. A silent client is given up
//! after a bounded retry budget (`transfer::RETRY_BUDGET`; a `timeout` option past
//! `transfer::MAX_TIMEOUT` is not granted). Files up to [`SHARED_MAX`] bytes (iPXE binaries
//! are about 1 MB) are read once and shared by every transfer until they change on disk; larger
//! ones are read a window at a time. `wire` holds the packet formats, `transfer` one transfer (both
//! public for the fuzz target `fuzz/fuzz_targets/tftp_packet.rs`).
//!
//! Imports the provisioning service; nothing from other front doors or the store.

pub mod transfer;
pub mod wire;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

pub use transfer::Source;
pub use wire::ErrorCode;

use crate::metrics::Metrics;
use crate::service::provisioning::{FileRefusal, ProvisioningService};

/// Label: the outcome of a read request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `served`, `not_found`, `denied`, `unavailable`, `failed`, `write_refused`, `busy`.
    pub outcome: String,
}

/// Files up to this size are held in memory, shared by every transfer of them.
pub const SHARED_MAX: u64 = 16 * 1024 * 1024;
/// Bytes held in memory at most; past this the held files are dropped and read again on demand.
const SHARED_TOTAL: u64 = 64 * 1024 * 1024;

/// What identifies a version of a file on disk: a file replaced or rewritten is read again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Version {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: Option<std::time::SystemTime>,
}

impl Version {
    fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Version {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: m.modified().ok(),
        }
    }
}

/// The shared copies of small files, by resolved path.
#[derive(Default)]
pub struct Files {
    shared: Mutex<Held>,
}

/// A small file held in memory.
struct HeldFile {
    version: Version,
    bytes: Arc<[u8]>,
    /// When the version on disk was last compared.
    checked: std::time::Instant,
    /// Since when one transfer is comparing it again (the others serve the held bytes meanwhile).
    checking: Option<std::time::Instant>,
}

/// The small files held in memory, by resolved path.
type Held = HashMap<PathBuf, HeldFile>;

/// How long a held file is served without comparing its version on disk again (a file replaced
/// is served within this time; the comparison is a blocking `stat`, a hop to another thread the
/// first block of every transfer would wait for).
const CHECKED_FOR: std::time::Duration = std::time::Duration::from_secs(1);

impl Files {
    /// `real`'s held copy if its version was compared less than [`CHECKED_FOR`] ago (no
    /// file-system call: safe on the runtime's own threads). Once that has passed, one caller is
    /// told to compare it again (`None`: it calls `open`) while the others are served the held
    /// copy until it has (at most another [`CHECKED_FOR`]): a storm of transfers starting after
    /// the expiry makes one blocking re-check, not one each.
    pub fn recent(&self, real: &Path) -> Option<Source> {
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let held = shared.get_mut(real)?;
        if held.checked.elapsed() >= CHECKED_FOR {
            match held.checking {
                Some(since) if since.elapsed() < CHECKED_FOR => {}
                _ => {
                    held.checking = Some(std::time::Instant::now());
                    return None;
                }
            }
        }
        Some(Source::Shared(held.bytes.clone()))
    }

    /// `real` is no longer what is held (gone, grown past [`SHARED_MAX`], unreadable).
    fn forget(&self, real: &Path) {
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(real);
    }

    /// Open `real` (a path the provisioning service resolved; blocking file-system calls: run on
    /// the blocking pool).
    pub fn open(&self, real: &Path) -> Result<Source, ErrorCode> {
        let opened = std::fs::File::open(real).and_then(|f| f.metadata().map(|m| (f, m)));
        let Ok((mut file, meta)) = opened else {
            self.forget(real);
            return Err(ErrorCode::FileNotFound);
        };
        let v = Version::of(&meta);
        if v.len > SHARED_MAX {
            self.forget(real);
            return Ok(Source::File(Arc::new(file), v.len));
        }
        {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(held) = shared.get_mut(real).filter(|h| h.version == v) {
                held.checked = std::time::Instant::now();
                held.checking = None;
                return Ok(Source::Shared(held.bytes.clone()));
            }
        }
        let mut buf = Vec::with_capacity(usize::try_from(v.len).unwrap_or(0));
        if let Err(e) = std::io::Read::read_to_end(&mut file, &mut buf) {
            tracing::warn!(file = %real.display(), error = %e, "tftp: cannot read");
            self.forget(real);
            return Err(ErrorCode::NotDefined);
        }
        let bytes: Arc<[u8]> = buf.into();
        // Held only when it did not change while it was read.
        if bytes.len() as u64 == v.len && file.metadata().is_ok_and(|m| Version::of(&m) == v) {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            let total: u64 = shared.values().map(|h| h.version.len).sum();
            if total + v.len > SHARED_TOTAL {
                shared.clear();
            }
            shared.insert(
                real.to_path_buf(),
                HeldFile {
                    version: v,
                    bytes: bytes.clone(),
                    checked: std::time::Instant::now(),
                    checking: None,
                },
            );
        } else {
            self.forget(real);
        }
        Ok(Source::Shared(bytes))
    }
}

/// TFTP settings.
#[derive(Clone, Debug)]
pub struct TftpOptions {
    /// Largest block size granted (RFC 2348); clients asking more get this.
    pub max_block_size: u16,
    /// Largest window granted (RFC 7440).
    pub max_window_size: u16,
    /// Transfers under way at once; read requests past it are dropped (the client retries).
    pub max_transfers: usize,
    /// Transfers under way at once to one client address.
    pub max_per_client: usize,
}

impl Default for TftpOptions {
    fn default() -> Self {
        TftpOptions {
            max_block_size: 1468,
            max_window_size: 16,
            // A thousand machines powered on at once each fetch their iPXE binary, and a request
            // past the cap waits with no answer while firmware gives up after some seconds of
            // silence: at 256, `bench/boot_storm.sh --machines 1000 --ramp-ms 0` (2026-12-05) lost
            // 92 machines in TFTP ("no answer after 6 transmissions", 2s apart). Running at once,
            // every transfer is slower but each client hears from the server. The descriptor
            // budget still lowers it where the limit is small (`app::DescriptorBudget`).
            max_transfers: 1024,
            // The issue-17 storm harness (100 curl clients on one address) was dropped at 8:
            // curl resends its request only after 6 s, which made the storm look slow.
            max_per_client: 64,
        }
    }
}

/// Requests of one address waiting for a transfer to end, at most.
pub const MAX_WAITING_PER_CLIENT: usize = 64;
/// How long a request waits for a transfer to end before it is dropped (as `busy`).
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The transfers under way, by client transfer identifier and by client address, and the
/// requests waiting for one of them to end (in arrival order).
#[derive(Default)]
struct Active {
    /// Transfer identifiers running or waiting (a retransmitted request starts nothing).
    by_tid: HashSet<SocketAddr>,
    /// Transfers running, in all and per address.
    running: usize,
    by_ip: HashMap<IpAddr, usize>,
    /// Requests waiting, and how many per address.
    queue: std::collections::VecDeque<(SocketAddr, tokio::sync::oneshot::Sender<()>)>,
    waiting_by_ip: HashMap<IpAddr, usize>,
}

/// What becomes of a read request.
#[derive(Debug)]
enum Admitted {
    /// Start now.
    Run,
    /// Start when told (the transfer it waits for ended), unless `MAX_WAIT` passes first.
    Wait(tokio::sync::oneshot::Receiver<()>),
}

/// Why a read request does not start a transfer.
#[derive(Debug, PartialEq, Eq)]
enum Busy {
    /// A retransmission of a request under way or waiting.
    Retransmitted,
    /// The transfers in all, or this client's, are at their cap, and so are the waiting requests.
    Full,
}

fn decrement(map: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
    if let Some(n) = map.get_mut(&ip) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(&ip);
        }
    }
}

impl Active {
    /// Admit a request from `client` within `max` transfers in all and `per_client` per address;
    /// past those, let it wait (no more waiting than `max` in all, [`MAX_WAITING_PER_CLIENT`] per
    /// address).
    fn admit(
        &mut self,
        client: SocketAddr,
        max: usize,
        per_client: usize,
    ) -> Result<Admitted, Busy> {
        if self.by_tid.contains(&client) {
            return Err(Busy::Retransmitted);
        }
        let ip = client.ip();
        let n = self.by_ip.get(&ip).copied().unwrap_or(0);
        if self.running < max && n < per_client {
            self.by_tid.insert(client);
            self.running += 1;
            self.by_ip.insert(ip, n + 1);
            return Ok(Admitted::Run);
        }
        let waiting = self.waiting_by_ip.get(&ip).copied().unwrap_or(0);
        if self.queue.len() >= max || waiting >= MAX_WAITING_PER_CLIENT.min(per_client) {
            return Err(Busy::Full);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.by_tid.insert(client);
        self.queue.push_back((client, tx));
        self.waiting_by_ip.insert(ip, waiting + 1);
        Ok(Admitted::Wait(rx))
    }

    /// A transfer ended: start the first waiting requests that now fit.
    fn done(&mut self, client: SocketAddr, max: usize, per_client: usize) {
        if !self.by_tid.remove(&client) {
            return;
        }
        self.running = self.running.saturating_sub(1);
        decrement(&mut self.by_ip, client.ip());
        let mut at = 0;
        while self.running < max && at < self.queue.len() {
            let ip = self.queue[at].0.ip();
            if self.by_ip.get(&ip).copied().unwrap_or(0) >= per_client {
                at += 1;
                continue;
            }
            let Some((tid, start)) = self.queue.remove(at) else {
                break;
            };
            decrement(&mut self.waiting_by_ip, ip);
            if start.send(()).is_err() {
                // Its wait ended meanwhile (shutdown): it never runs.
                self.by_tid.remove(&tid);
                continue;
            }
            self.running += 1;
            *self.by_ip.entry(ip).or_default() += 1;
        }
    }

    /// A waiting request's time ran out: true when it was still waiting (it is dropped now),
    /// false when it was started meanwhile.
    fn give_up(&mut self, client: SocketAddr) -> bool {
        let Some(at) = self.queue.iter().position(|(tid, _)| *tid == client) else {
            return false;
        };
        self.queue.remove(at);
        decrement(&mut self.waiting_by_ip, client.ip());
        self.by_tid.remove(&client);
        true
    }
}

/// What every transfer shares.
struct Front {
    files: Files,
    limits: transfer::Limits,
    requests: Family<OutcomeLabel, Counter>,
    provisioning: ProvisioningService,
    /// Transfers under way: a retransmitted request does not start a second one, and past the caps
    /// a request starts none.
    active: Mutex<Active>,
    max_transfers: usize,
    max_per_client: usize,
    local_ip: IpAddr,
}

impl Front {
    fn active(&self) -> std::sync::MutexGuard<'_, Active> {
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, outcome: &str) {
        self.requests
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// A socket for one exchange with `client`: a new transfer identifier (RFC 1350 section 4),
    /// connected so that the kernel drops datagrams from anyone else.
    async fn socket(&self, client: SocketAddr) -> std::io::Result<UdpSocket> {
        let s = UdpSocket::bind(SocketAddr::new(self.local_ip, 0)).await?;
        s.connect(client).await?;
        Ok(s)
    }

    async fn refuse(&self, client: SocketAddr, code: ErrorCode) {
        // Errors are sent once and never retransmitted (RFC 1350 section 7).
        if let Ok(s) = self.socket(client).await {
            let _ = s.send(&wire::error(code)).await;
        }
    }

    /// One request, start to end.
    async fn exchange(self: Arc<Self>, client: SocketAddr, request: wire::Request) {
        let (filename, options) = match request {
            wire::Request::Write { filename } => {
                self.count("write_refused");
                tracing::warn!(%client, file = %filename, "tftp write refused: the server is read-only");
                return self.refuse(client, ErrorCode::IllegalOperation).await;
            }
            wire::Request::Read {
                filename, options, ..
            } => (filename, options),
        };
        let real = match self.provisioning.tftp_file(client.ip(), &filename).await {
            Ok(p) => p,
            Err(refusal) => {
                let (outcome, code) = match refusal {
                    FileRefusal::Denied => ("denied", ErrorCode::AccessViolation),
                    FileRefusal::NotFound => ("not_found", ErrorCode::FileNotFound),
                    FileRefusal::Unavailable => ("unavailable", ErrorCode::NotDefined),
                };
                self.count(outcome);
                tracing::info!(%client, file = %filename, outcome, "tftp refused");
                return self.refuse(client, code).await;
            }
        };
        let opened = match self.files.recent(&real) {
            Some(held) => Ok(held),
            None => {
                let front = self.clone();
                tokio::task::spawn_blocking(move || front.files.open(&real))
                    .await
                    .unwrap_or(Err(ErrorCode::NotDefined))
            }
        };
        let source = match opened {
            Ok(s) => s,
            Err(code) => {
                let outcome = match code {
                    ErrorCode::FileNotFound => "not_found",
                    _ => "failed",
                };
                self.count(outcome);
                tracing::info!(%client, file = %filename, outcome, "tftp refused");
                return self.refuse(client, code).await;
            }
        };
        let len = source.len();
        self.count("served");
        tracing::info!(%client, file = %filename, bytes = len, "tftp read");
        let neg = transfer::negotiate(&options, self.limits, len);
        let socket = match self.socket(client).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%client, error = %e, "tftp: cannot open a transfer socket");
                return;
            }
        };
        match transfer::send(&socket, &source, &neg).await {
            Ok(_) => tracing::debug!(%client, file = %filename, "tftp transfer done"),
            Err(e) => {
                tracing::info!(%client, file = %filename, error = %e, "tftp transfer abandoned")
            }
        }
    }
}

/// Receive buffer of the server port.
const REQUEST_BUFFER: usize = 4 << 20;

/// Serve the boot files `provisioning` hands out on an already-bound socket until `shutdown`.
pub async fn serve(
    socket: std::net::UdpSocket,
    provisioning: ProvisioningService,
    opts: TftpOptions,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let requests = Family::<OutcomeLabel, Counter>::default();
    metrics.register(
        "tftp_requests",
        "TFTP requests, by outcome",
        requests.clone(),
    );
    socket.set_nonblocking(true)?;
    // A boot storm's read requests arrive together: room for thousands (the default buffer
    // holds about a hundred), past net.core.rmem_max where the process may.
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(&socket, REQUEST_BUFFER).is_err() {
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&socket, REQUEST_BUFFER);
    }
    let socket = UdpSocket::from_std(socket)?;
    let front = Arc::new(Front {
        files: Files::default(),
        limits: transfer::Limits {
            max_block_size: opts.max_block_size,
            max_window_size: opts.max_window_size,
        },
        requests,
        provisioning,
        active: Mutex::default(),
        max_transfers: opts.max_transfers.max(1),
        max_per_client: opts.max_per_client.max(1),
        local_ip: socket.local_addr()?.ip(),
    });
    // The receive loop runs on one of the runtime's workers, beside the transfers it starts,
    // not on the thread that drives the runtime: a request's task then starts on the thread
    // that received it, without waking another.
    tokio::spawn(receive(socket, front, shutdown))
        .await
        .map_err(|e| anyhow::anyhow!("the TFTP receive loop ended: {e}"))
}

/// Read requests on the server port until `shutdown`: each admitted one becomes a task.
async fn receive(socket: UdpSocket, front: Arc<Front>, shutdown: CancellationToken) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, client) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = socket.recv_from(&mut buf) => match r {
                Ok(x) => x,
                // An ICMP error of an earlier send, or a transient failure: keep serving.
                Err(e) => {
                    tracing::debug!(error = %e, "tftp: receive failed");
                    continue;
                }
            },
        };
        // Anything but a well-formed RRQ or WRQ on the server port is ignored.
        let Some(request) = wire::parse_request(&buf[..n]) else {
            continue;
        };
        let admitted = front
            .active()
            .admit(client, front.max_transfers, front.max_per_client);
        let wait = match admitted {
            Ok(Admitted::Run) => None,
            Ok(Admitted::Wait(start)) => Some(start),
            Err(Busy::Retransmitted) => continue,
            Err(Busy::Full) => {
                // Dropped before any socket or task: the client retransmits later.
                front.count("busy");
                tracing::debug!(%client, "tftp: too many transfers under way or waiting; request dropped");
                continue;
            }
        };
        let (front, stop) = (front.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Some(mut start) = wait {
                // The receiver lives until `give_up` decided under the lock: a start sent after
                // the time ran out is still seen (and accounted) as a start.
                let started = tokio::select! {
                    _ = stop.cancelled() => false,
                    r = tokio::time::timeout(MAX_WAIT, &mut start) => matches!(r, Ok(Ok(()))),
                };
                if !started && front.active().give_up(client) {
                    front.count("busy");
                    tracing::debug!(%client, "tftp: waited too long for a transfer to end; request dropped");
                    return;
                }
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = front.clone().exchange(client, request) => {}
            }
            front
                .active()
                .done(client, front.max_transfers, front.max_per_client);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_are_capped_in_all_and_per_client_and_the_rest_wait_bounded() {
        let mut a = Active::default();
        let c = |ip: &str, port: u16| SocketAddr::new(ip.parse().expect("ip"), port);
        let run = |r: Result<Admitted, Busy>| matches!(r, Ok(Admitted::Run));
        assert!(run(a.admit(c("10.0.0.1", 1), 3, 2)));
        assert_eq!(
            a.admit(c("10.0.0.1", 1), 3, 2).err(),
            Some(Busy::Retransmitted)
        );
        assert!(run(a.admit(c("10.0.0.1", 2), 3, 2)));
        // Past the address's cap: waits (at most 2 of this address, the per-client cap).
        let Ok(Admitted::Wait(mut w3)) = a.admit(c("10.0.0.1", 3), 3, 2) else {
            panic!("waits")
        };
        assert_eq!(
            a.admit(c("10.0.0.1", 3), 3, 2).err(),
            Some(Busy::Retransmitted),
            "a waiting request's retransmission starts nothing"
        );
        let Ok(Admitted::Wait(_w4)) = a.admit(c("10.0.0.1", 4), 3, 2) else {
            panic!("waits")
        };
        assert_eq!(a.admit(c("10.0.0.1", 5), 3, 2).err(), Some(Busy::Full));
        assert!(run(a.admit(c("10.0.0.2", 1), 3, 2)));
        // Past the cap in all: waits, up to as many as may run (3): one more.
        let Ok(Admitted::Wait(mut w31)) = a.admit(c("10.0.0.3", 1), 3, 2) else {
            panic!("waits")
        };
        assert_eq!(a.admit(c("10.0.0.4", 1), 3, 2).err(), Some(Busy::Full));
        // 10.0.0.2 ends: the first waiting request that fits starts (10.0.0.1 is at its cap).
        a.done(c("10.0.0.2", 1), 3, 2);
        assert!(w31.try_recv().is_ok(), "10.0.0.3 started");
        assert!(w3.try_recv().is_err());
        // One of 10.0.0.1's ends: its first waiting request starts.
        a.done(c("10.0.0.1", 1), 3, 2);
        a.done(c("10.0.0.1", 1), 3, 2);
        assert!(w3.try_recv().is_ok(), "10.0.0.1:3 started");
        assert!(!a.give_up(c("10.0.0.1", 3)), "started, not given up");
        // The last one waits out its time.
        assert!(a.give_up(c("10.0.0.1", 4)));
        for (ip, port) in [("10.0.0.1", 2), ("10.0.0.1", 3), ("10.0.0.3", 1)] {
            a.done(c(ip, port), 3, 2);
        }
        assert!(a.by_tid.is_empty() && a.by_ip.is_empty() && a.waiting_by_ip.is_empty());
        assert_eq!((a.running, a.queue.len()), (0, 0));
    }

    #[test]
    fn small_files_are_shared_until_they_change() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("a"), b"one").expect("file");
        let files = Files::default();
        let a = dir.path().join("a");
        let bytes = |s: Source| match s {
            Source::Shared(b) => b,
            Source::File(..) => panic!("a small file is shared"),
        };
        let first = bytes(files.open(&a).expect("open"));
        let again = bytes(files.open(&a).expect("open"));
        assert!(Arc::ptr_eq(&first, &again), "read once");
        let recent = files.recent(&a).map(bytes).expect("compared just now");
        assert!(Arc::ptr_eq(&first, &recent), "served without a stat");
        // Replaced (a new inode), as an upgrade of the iPXE binaries would.
        std::fs::write(dir.path().join("a.new"), b"two!").expect("file");
        std::fs::rename(dir.path().join("a.new"), dir.path().join("a")).expect("rename");
        assert_eq!(&bytes(files.open(&a).expect("open"))[..], b"two!");
        assert!(matches!(
            files.open(&dir.path().join("missing")),
            Err(ErrorCode::FileNotFound)
        ));
    }
}

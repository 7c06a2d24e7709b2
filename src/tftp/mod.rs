//! The TFTP front door (RFC 1350; options RFC 2347, blksize RFC 2348, timeout and tsize RFC 2349,
//! windowsize RFC 7440): read-only. Which file a read request gets (a name inside the iPXE
//! directory, never `..`, a path or symlink out of it, or a non-file) and the `tftp.read` step of
//! the boot timeline are the provisioning service's answer; this door decodes the request, asks
//! it, and sends the file or a TFTP error packet. Every write request is refused.
//!
//! Each read is a tokio task with its own socket (the transfer identifier), connected to the
//! client, waiting for ACKs with tokio's timers. Transfers under way are capped in all and per
//! client address: a read request past a cap is dropped before any socket or task exists (the
//! client retransmits it), and a silent client is given up after a bounded retry budget
//! (`transfer::RETRY_BUDGET`; a `timeout` option past `transfer::MAX_TIMEOUT` is not granted). Files up to [`SHARED_MAX`] bytes (iPXE binaries
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

/// The small files held in memory, by resolved path: the version read, the bytes, and when the
/// version on disk was last compared.
type Held = HashMap<PathBuf, (Version, Arc<[u8]>, std::time::Instant)>;

/// How long a held file is served without comparing its version on disk again (a file replaced
/// is served within this time; the comparison is a blocking `stat`, a hop to another thread the
/// first block of every transfer would wait for).
const CHECKED_FOR: std::time::Duration = std::time::Duration::from_secs(1);

impl Files {
    /// `real`'s held copy if its version was compared less than [`CHECKED_FOR`] ago (no
    /// file-system call: safe on the runtime's own threads).
    pub fn recent(&self, real: &Path) -> Option<Source> {
        let shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared
            .get(real)
            .filter(|(_, _, at)| at.elapsed() < CHECKED_FOR)
            .map(|(_, b, _)| Source::Shared(b.clone()))
    }

    /// Open `real` (a path the provisioning service resolved; blocking file-system calls: run on
    /// the blocking pool).
    pub fn open(&self, real: &Path) -> Result<Source, ErrorCode> {
        let mut file = std::fs::File::open(real).map_err(|_| ErrorCode::FileNotFound)?;
        let meta = file.metadata().map_err(|_| ErrorCode::FileNotFound)?;
        let v = Version::of(&meta);
        if v.len > SHARED_MAX {
            return Ok(Source::File(Arc::new(file), v.len));
        }
        {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, b, at)) = shared.get_mut(real).filter(|(held, _, _)| *held == v) {
                *at = std::time::Instant::now();
                return Ok(Source::Shared(b.clone()));
            }
        }
        let mut buf = Vec::with_capacity(usize::try_from(v.len).unwrap_or(0));
        std::io::Read::read_to_end(&mut file, &mut buf).map_err(|e| {
            tracing::warn!(file = %real.display(), error = %e, "tftp: cannot read");
            ErrorCode::NotDefined
        })?;
        let bytes: Arc<[u8]> = buf.into();
        // Held only when it did not change while it was read.
        if bytes.len() as u64 == v.len && file.metadata().is_ok_and(|m| Version::of(&m) == v) {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            let total: u64 = shared.values().map(|(v, _, _)| v.len).sum();
            if total + v.len > SHARED_TOTAL {
                shared.clear();
            }
            shared.insert(
                real.to_path_buf(),
                (v, bytes.clone(), std::time::Instant::now()),
            );
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
            max_transfers: 256,
            max_per_client: 8,
        }
    }
}

/// The transfers under way, by client transfer identifier and by client address.
#[derive(Default)]
struct Active {
    by_tid: HashSet<SocketAddr>,
    by_ip: HashMap<IpAddr, usize>,
}

/// Why a read request does not start a transfer.
#[derive(Debug, PartialEq, Eq)]
enum Busy {
    /// A retransmission of a request under way.
    Retransmitted,
    /// The transfers in all, or this client's, are at their cap.
    Full,
}

impl Active {
    /// Admit a request from `client` within `max` transfers in all and `per_client` per address.
    fn admit(&mut self, client: SocketAddr, max: usize, per_client: usize) -> Result<(), Busy> {
        if self.by_tid.contains(&client) {
            return Err(Busy::Retransmitted);
        }
        let n = self.by_ip.get(&client.ip()).copied().unwrap_or(0);
        if self.by_tid.len() >= max || n >= per_client {
            return Err(Busy::Full);
        }
        self.by_tid.insert(client);
        self.by_ip.insert(client.ip(), n + 1);
        Ok(())
    }

    fn done(&mut self, client: SocketAddr) {
        if self.by_tid.remove(&client) {
            if let Some(n) = self.by_ip.get_mut(&client.ip()) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.by_ip.remove(&client.ip());
                }
            }
        }
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
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, client) = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
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
            .active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(client, front.max_transfers, front.max_per_client);
        match admitted {
            Ok(()) => {}
            Err(Busy::Retransmitted) => continue,
            Err(Busy::Full) => {
                // Dropped before any socket or task: the client retransmits later.
                front.count("busy");
                tracing::debug!(%client, "tftp: too many transfers under way; request dropped");
                continue;
            }
        }
        let (front, stop) = (front.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = front.clone().exchange(client, request) => {}
            }
            front
                .active
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .done(client);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_are_capped_in_all_and_per_client() {
        let mut a = Active::default();
        let c = |ip: &str, port: u16| SocketAddr::new(ip.parse().expect("ip"), port);
        assert_eq!(a.admit(c("10.0.0.1", 1), 3, 2), Ok(()));
        assert_eq!(a.admit(c("10.0.0.1", 1), 3, 2), Err(Busy::Retransmitted));
        assert_eq!(a.admit(c("10.0.0.1", 2), 3, 2), Ok(()));
        assert_eq!(a.admit(c("10.0.0.1", 3), 3, 2), Err(Busy::Full));
        assert_eq!(a.admit(c("10.0.0.2", 1), 3, 2), Ok(()));
        assert_eq!(a.admit(c("10.0.0.3", 1), 3, 2), Err(Busy::Full));
        a.done(c("10.0.0.1", 1));
        a.done(c("10.0.0.1", 1));
        assert_eq!(a.admit(c("10.0.0.3", 1), 3, 2), Ok(()));
        for (ip, port) in [("10.0.0.1", 2), ("10.0.0.2", 1), ("10.0.0.3", 1)] {
            a.done(c(ip, port));
        }
        assert!(a.by_tid.is_empty() && a.by_ip.is_empty());
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

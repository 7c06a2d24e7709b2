//! The TFTP front door (RFC 1350; options RFC 2347, blksize RFC 2348, timeout and tsize RFC 2349,
//! windowsize RFC 7440): read-only, rooted in one directory. `..`, absolute paths that leave the
//! root, symlinks that point outside it, non-files and every write request are refused with a
//! TFTP error packet.
//!
//! Each read is a tokio task with its own socket (the transfer identifier), connected to the
//! client, waiting for ACKs with tokio's timers. Files up to [`SHARED_MAX`] bytes (iPXE binaries
//! are about 1 MB) are read once and shared by every transfer until they change on disk; larger
//! ones are read a window at a time. `wire` holds the packet formats, `transfer` one transfer.
//!
//! Imports nothing from other front doors, the store or the service layer: it only serves files.

mod transfer;
mod wire;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

pub use transfer::Source;
pub use wire::ErrorCode;

use crate::metrics::Metrics;
use crate::service::timeline::{Step, Timeline};

/// Label: the outcome of a read request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `served`, `not_found`, `denied`, `write_refused`.
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

/// The served directory: resolution inside the root, and the shared copies of small files.
pub struct Files {
    root: PathBuf,
    shared: Mutex<Held>,
}

/// The small files held in memory, by resolved path.
type Held = HashMap<PathBuf, (Version, Arc<[u8]>)>;

impl Files {
    /// Serve files below `root` (which must exist).
    pub fn new(root: &Path) -> std::io::Result<Self> {
        Ok(Files {
            root: std::fs::canonicalize(root)?,
            shared: Mutex::default(),
        })
    }

    /// Resolve and open `requested` (blocking file-system calls: run on the blocking pool).
    pub fn open(&self, requested: &Path) -> Result<Source, ErrorCode> {
        let real = resolve_in(&self.root, requested)?;
        let mut file = std::fs::File::open(&real).map_err(|_| ErrorCode::FileNotFound)?;
        let meta = file.metadata().map_err(|_| ErrorCode::FileNotFound)?;
        let v = Version::of(&meta);
        if v.len > SHARED_MAX {
            return Ok(Source::File(Arc::new(file), v.len));
        }
        let held = |shared: &Held| {
            shared
                .get(&real)
                .filter(|(held, _)| *held == v)
                .map(|(_, b)| b.clone())
        };
        if let Some(b) = held(&self.shared.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(Source::Shared(b));
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
            let total: u64 = shared.values().map(|(v, _)| v.len).sum();
            if total + v.len > SHARED_TOTAL {
                shared.clear();
            }
            shared.insert(real, (v, bytes.clone()));
        }
        Ok(Source::Shared(bytes))
    }
}

/// Resolve `requested` inside `root` (canonical): leading `/` is taken as the root itself; `..`
/// anywhere, a Windows prefix, or a symlink leading outside the root is refused.
pub fn resolve_in(root: &Path, requested: &Path) -> Result<PathBuf, ErrorCode> {
    let rel = requested.strip_prefix("/").unwrap_or(requested);
    if rel.as_os_str().is_empty() {
        return Err(ErrorCode::FileNotFound);
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            _ => return Err(ErrorCode::AccessViolation),
        }
    }
    let joined = root.join(rel);
    let real = std::fs::canonicalize(&joined).map_err(|_| ErrorCode::FileNotFound)?;
    if !real.starts_with(root) {
        return Err(ErrorCode::AccessViolation);
    }
    if !real.is_file() {
        return Err(ErrorCode::FileNotFound);
    }
    Ok(real)
}

/// TFTP settings.
#[derive(Clone, Debug)]
pub struct TftpOptions {
    /// Largest block size granted (RFC 2348); clients asking more get this.
    pub max_block_size: u16,
    /// Largest window granted (RFC 7440).
    pub max_window_size: u16,
}

/// What every transfer shares.
struct Front {
    files: Files,
    limits: transfer::Limits,
    requests: Family<OutcomeLabel, Counter>,
    timeline: Option<Timeline>,
    /// Clients with a transfer under way: a retransmitted request does not start a second one.
    busy: Mutex<HashSet<SocketAddr>>,
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
        let front = self.clone();
        let name = filename.clone();
        let opened = tokio::task::spawn_blocking(move || front.files.open(Path::new(&name)))
            .await
            .unwrap_or(Err(ErrorCode::NotDefined));
        let source = match opened {
            Ok(s) => s,
            Err(code) => {
                let outcome = match code {
                    ErrorCode::AccessViolation => "denied",
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
        if let (Some(t), IpAddr::V4(ip)) = (&self.timeline, client.ip()) {
            t.record(Step {
                kind: "tftp.read",
                mac: None,
                ip: Some(ip),
                detail: serde_json::json!({"file": filename, "bytes": len}),
            });
        }
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

/// Serve `root` on an already-bound socket until `shutdown`.
pub async fn serve(
    socket: std::net::UdpSocket,
    root: PathBuf,
    opts: TftpOptions,
    metrics: Arc<Metrics>,
    timeline: Option<Timeline>,
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
        files: Files::new(&root)?,
        limits: transfer::Limits {
            max_block_size: opts.max_block_size,
            max_window_size: opts.max_window_size,
        },
        requests,
        timeline,
        busy: Mutex::default(),
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
        if !front
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(client)
        {
            continue; // a retransmitted request of a transfer under way
        }
        let (front, stop) = (front.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = front.clone().exchange(client, request) => {}
            }
            front
                .busy
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&client);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_stays_in_the_root() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = std::fs::canonicalize(dir.path().join(".")).expect("root");
        std::fs::create_dir(root.join("sub")).expect("sub");
        std::fs::write(root.join("ipxe.efi"), b"x").expect("file");
        std::fs::write(root.join("sub/a"), b"x").expect("file");
        let outside = tempfile::tempdir().expect("tmp");
        std::fs::write(outside.path().join("secret"), b"s").expect("file");
        std::os::unix::fs::symlink(outside.path().join("secret"), root.join("link"))
            .expect("symlink");
        std::os::unix::fs::symlink(root.join("ipxe.efi"), root.join("inside")).expect("symlink");
        let ok = |p: &str| resolve_in(&root, Path::new(p));
        assert!(ok("ipxe.efi").is_ok());
        assert!(ok("/ipxe.efi").is_ok());
        assert!(ok("./sub/a").is_ok());
        assert!(ok("inside").is_ok(), "a symlink inside the root is fine");
        assert!(matches!(
            ok("../etc/passwd"),
            Err(ErrorCode::AccessViolation)
        ));
        assert!(matches!(
            ok("sub/../ipxe.efi"),
            Err(ErrorCode::AccessViolation)
        ));
        assert!(matches!(ok("link"), Err(ErrorCode::AccessViolation)));
        assert!(matches!(ok("sub"), Err(ErrorCode::FileNotFound)));
        assert!(matches!(ok("missing"), Err(ErrorCode::FileNotFound)));
        assert!(
            matches!(ok("/etc/passwd"), Err(ErrorCode::FileNotFound)),
            "absolute paths are inside the root"
        );
    }

    #[test]
    fn small_files_are_shared_until_they_change() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("a"), b"one").expect("file");
        let files = Files::new(dir.path()).expect("root");
        let bytes = |s: Source| match s {
            Source::Shared(b) => b,
            Source::File(..) => panic!("a small file is shared"),
        };
        let first = bytes(files.open(Path::new("a")).expect("open"));
        let again = bytes(files.open(Path::new("/a")).expect("open"));
        assert!(Arc::ptr_eq(&first, &again), "read once");
        // Replaced (a new inode), as an upgrade of the iPXE binaries would.
        std::fs::write(dir.path().join("a.new"), b"two!").expect("file");
        std::fs::rename(dir.path().join("a.new"), dir.path().join("a")).expect("rename");
        assert_eq!(
            &bytes(files.open(Path::new("a")).expect("open"))[..],
            b"two!"
        );
        assert!(matches!(
            files.open(Path::new("../a")),
            Err(ErrorCode::AccessViolation)
        ));
    }
}

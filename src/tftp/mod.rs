//! The TFTP front door (RFC 1350, options RFC 2347/2348/2349, windowsize RFC 7440) on `async-tftp`:
//! read-only, rooted in one directory. `..`, absolute paths that leave the root, symlinks that point
//! outside it, non-files and every write request are refused with a TFTP error packet.
//!
//! Imports nothing from other front doors, the store or the service layer: it only serves files.

use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_tftp::packet;
use async_tftp::server::{Handler, TftpServerBuilder};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Label: the outcome of a read request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `served`, `not_found`, `denied`, `write_refused`.
    pub outcome: String,
}

/// A read-only handler rooted in one directory.
pub struct RootedHandler {
    root: PathBuf,
    requests: Family<OutcomeLabel, Counter>,
    timeline: Option<crate::service::timeline::Timeline>,
}

impl RootedHandler {
    /// Serve files below `root` (which must exist).
    pub fn new(root: &Path, metrics: &Metrics) -> std::io::Result<Self> {
        let root = std::fs::canonicalize(root)?;
        let requests = Family::<OutcomeLabel, Counter>::default();
        metrics.register(
            "tftp_requests",
            "TFTP requests, by outcome",
            requests.clone(),
        );
        Ok(Self {
            root,
            requests,
            timeline: None,
        })
    }

    /// Report every read to the boot timeline.
    pub fn with_timeline(mut self, timeline: Option<crate::service::timeline::Timeline>) -> Self {
        self.timeline = timeline;
        self
    }

    fn count(&self, outcome: &str) {
        self.requests
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Resolve a requested name to a regular file inside the root.
    pub fn resolve(&self, requested: &Path) -> Result<PathBuf, packet::Error> {
        resolve_in(&self.root, requested)
    }
}

/// Resolve `requested` inside `root` (canonical): leading `/` is taken as the root itself; `..`
/// anywhere, a Windows prefix, or a symlink leading outside the root is refused.
pub fn resolve_in(root: &Path, requested: &Path) -> Result<PathBuf, packet::Error> {
    let rel = requested.strip_prefix("/").unwrap_or(requested);
    if rel.as_os_str().is_empty() {
        return Err(packet::Error::FileNotFound);
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            _ => return Err(packet::Error::PermissionDenied),
        }
    }
    let joined = root.join(rel);
    let real = std::fs::canonicalize(&joined).map_err(|_| packet::Error::FileNotFound)?;
    if !real.starts_with(root) {
        return Err(packet::Error::PermissionDenied);
    }
    if !real.is_file() {
        return Err(packet::Error::FileNotFound);
    }
    Ok(real)
}

impl Handler for RootedHandler {
    type Reader = blocking::Unblock<std::fs::File>;
    type Writer = blocking::Unblock<std::fs::File>;

    async fn read_req_open(
        &mut self,
        client: &SocketAddr,
        path: &Path,
    ) -> Result<(Self::Reader, Option<u64>), packet::Error> {
        let real = match self.resolve(path) {
            Ok(p) => p,
            Err(e) => {
                let outcome = if matches!(e, packet::Error::PermissionDenied) {
                    "denied"
                } else {
                    "not_found"
                };
                self.count(outcome);
                tracing::info!(%client, file = %path.display(), outcome, "tftp refused");
                return Err(e);
            }
        };
        let file = std::fs::File::open(&real).map_err(|_| packet::Error::FileNotFound)?;
        let len = file.metadata().ok().map(|m| m.len());
        self.count("served");
        tracing::info!(%client, file = %path.display(), bytes = len.unwrap_or(0), "tftp read");
        if let (Some(t), std::net::IpAddr::V4(ip)) = (&self.timeline, client.ip()) {
            t.record(crate::service::timeline::Step {
                kind: "tftp.read",
                mac: None,
                ip: Some(ip),
                detail: serde_json::json!({"file": path.display().to_string(), "bytes": len}),
            });
        }
        Ok((blocking::Unblock::new(file), len))
    }

    async fn write_req_open(
        &mut self,
        client: &SocketAddr,
        path: &Path,
        _size: Option<u64>,
    ) -> Result<Self::Writer, packet::Error> {
        self.count("write_refused");
        tracing::warn!(%client, file = %path.display(), "tftp write refused: the server is read-only");
        Err(packet::Error::IllegalOperation)
    }
}

/// TFTP settings.
#[derive(Clone, Debug)]
pub struct TftpOptions {
    /// Largest block size granted (RFC 2348); clients asking more get this.
    pub max_block_size: u16,
    /// Largest window granted (RFC 7440).
    pub max_window_size: u16,
}

/// Serve `root` on an already-bound socket until `shutdown`.
pub async fn serve(
    socket: std::net::UdpSocket,
    root: PathBuf,
    opts: TftpOptions,
    metrics: Arc<Metrics>,
    timeline: Option<crate::service::timeline::Timeline>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let handler = RootedHandler::new(&root, &metrics)?.with_timeline(timeline);
    socket.set_nonblocking(true)?;
    let server = TftpServerBuilder::with_handler(handler)
        .std_socket(socket)?
        .block_size_limit(opts.max_block_size)
        .window_size_limit(opts.max_window_size)
        .build()
        .await?;
    tokio::select! {
        _ = shutdown.cancelled() => Ok(()),
        r = server.serve() => r.map_err(anyhow::Error::from),
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
            Err(packet::Error::PermissionDenied)
        ));
        assert!(matches!(
            ok("sub/../ipxe.efi"),
            Err(packet::Error::PermissionDenied)
        ));
        assert!(matches!(ok("link"), Err(packet::Error::PermissionDenied)));
        assert!(matches!(ok("sub"), Err(packet::Error::FileNotFound)));
        assert!(matches!(ok("missing"), Err(packet::Error::FileNotFound)));
        assert!(
            matches!(ok("/etc/passwd"), Err(packet::Error::FileNotFound)),
            "absolute paths are inside the root"
        );
    }
}

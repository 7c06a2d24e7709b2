//! The boot files: the iPXE binaries in the configured directory, served by TFTP and by
//! `/ipxe/{file}` over HTTP (UEFI HTTP boot). A requested name resolves inside the directory only:
//! `..`, a Windows prefix, a symlink leading out of it and anything but a regular file are
//! refused. Which binary each firmware gets is the domain's one table (`IPXE_BINARIES`).
//!
//! A name resolved is remembered for [`RESOLVED_FOR`] (at most [`RESOLVED_MAX`] names): a boot
//! storm asks for the same two or three files thousands of times, and each resolution costs a
//! dozen file-system calls on a blocking thread (a hop the first TFTP block waits for). A file
//! replaced or removed is seen within that time.
//!
//! Imports `domain` only.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::domain::dhcp::IPXE_BINARIES;

/// Why a boot file is not served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileRefusal {
    /// No such file (or not a regular file).
    NotFound,
    /// The name leaves the directory.
    Denied,
    /// Plinth cannot answer now (a store fault): the client should retry, nothing is "missing".
    Unavailable,
}

/// How long a resolved name is trusted without looking at the file system again.
pub const RESOLVED_FOR: Duration = Duration::from_secs(1);
/// Names remembered at most (clients choose names: the map is cleared when full).
const RESOLVED_MAX: usize = 64;

/// A resolved name: the file and its length, when that was seen, and since when one caller is
/// resolving it again.
type Resolved = HashMap<String, (PathBuf, u64, Instant, Option<Instant>)>;

/// The directory of boot files.
#[derive(Clone, Debug)]
pub struct BootFiles {
    dir: Option<PathBuf>,
    resolved: Arc<Mutex<Resolved>>,
}

impl BootFiles {
    /// The files in `dir` (none when `None`).
    pub fn new(dir: Option<PathBuf>) -> Self {
        BootFiles {
            dir,
            resolved: Arc::default(),
        }
    }

    /// `requested`'s file and length if it was resolved less than [`RESOLVED_FOR`] ago (no
    /// file-system call). Once that has passed, one caller is told to resolve it again (`None`)
    /// while the others keep the answer until that caller has one (at most another
    /// [`RESOLVED_FOR`]): a storm's requests make one re-check, not one each.
    pub fn recent(&self, requested: &str) -> Option<(PathBuf, u64)> {
        let mut map = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        let (path, len, at, checking) = map.get_mut(requested)?;
        if at.elapsed() >= RESOLVED_FOR {
            match checking {
                Some(since) if since.elapsed() < RESOLVED_FOR => {}
                _ => {
                    *checking = Some(Instant::now());
                    return None;
                }
            }
        }
        Some((path.clone(), *len))
    }

    /// Resolve `requested` and read its length (blocking file-system calls); remembered for
    /// [`BootFiles::recent`].
    pub fn resolve_len(&self, requested: &str) -> Result<(PathBuf, u64), FileRefusal> {
        let path = match self.resolve(requested) {
            Ok(p) => p,
            Err(e) => {
                // Gone (or now outside): nobody is answered from the old resolution.
                let mut map = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
                map.remove(requested);
                return Err(e);
            }
        };
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let mut map = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= RESOLVED_MAX && !map.contains_key(requested) {
            map.clear();
        }
        map.insert(
            requested.to_string(),
            (path.clone(), len, Instant::now(), None),
        );
        Ok((path, len))
    }

    /// The configured directory.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Which firmware the binaries present can boot (`bios`, `uefi-x86_64`, ...).
    pub fn bootable(&self) -> Vec<String> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        IPXE_BINARIES
            .iter()
            .filter(|b| dir.join(b.file).is_file())
            .map(|b| b.boots.to_string())
            .collect()
    }

    /// Resolve `requested` inside the directory (blocking file-system calls).
    pub fn resolve(&self, requested: &str) -> Result<PathBuf, FileRefusal> {
        let dir = self.dir.as_ref().ok_or(FileRefusal::NotFound)?;
        let root = std::fs::canonicalize(dir).map_err(|_| FileRefusal::NotFound)?;
        resolve_in(&root, Path::new(requested))
    }
}

/// Resolve `requested` inside `root` (canonical): a leading `/` is taken as the root itself; `..`
/// anywhere, a Windows prefix, or a symlink leading outside the root is refused.
pub fn resolve_in(root: &Path, requested: &Path) -> Result<PathBuf, FileRefusal> {
    let rel = requested.strip_prefix("/").unwrap_or(requested);
    if rel.as_os_str().is_empty() {
        return Err(FileRefusal::NotFound);
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            _ => return Err(FileRefusal::Denied),
        }
    }
    let joined = root.join(rel);
    let real = std::fs::canonicalize(&joined).map_err(|_| FileRefusal::NotFound)?;
    if !real.starts_with(root) {
        return Err(FileRefusal::Denied);
    }
    if !real.is_file() {
        return Err(FileRefusal::NotFound);
    }
    Ok(real)
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
        assert_eq!(ok("../etc/passwd"), Err(FileRefusal::Denied));
        assert_eq!(ok("sub/../ipxe.efi"), Err(FileRefusal::Denied));
        assert_eq!(ok("link"), Err(FileRefusal::Denied));
        assert_eq!(ok("sub"), Err(FileRefusal::NotFound));
        assert_eq!(ok("missing"), Err(FileRefusal::NotFound));
        assert_eq!(
            ok("/etc/passwd"),
            Err(FileRefusal::NotFound),
            "absolute paths are inside the root"
        );
    }

    #[test]
    fn bootable_reports_the_binaries_present() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("ipxe.efi"), b"x").expect("file");
        std::fs::write(dir.path().join("undionly.kpxe"), b"x").expect("file");
        let files = BootFiles::new(Some(dir.path().to_path_buf()));
        assert_eq!(files.bootable(), vec!["bios", "uefi-x86_64"]);
        assert!(BootFiles::new(None).bootable().is_empty());
        assert_eq!(files.resolve("ipxe.efi").map(|_| ()), Ok(()));
        assert_eq!(files.recent("ipxe.efi"), None);
        let (path, len) = files.resolve_len("ipxe.efi").expect("resolved");
        assert_eq!(files.recent("ipxe.efi"), Some((path, len)));
        assert_eq!(len, 1);
        assert_eq!(
            BootFiles::new(None).resolve("ipxe.efi"),
            Err(FileRefusal::NotFound)
        );
    }
}

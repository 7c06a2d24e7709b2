//! The Talos image cache: kernel and initramfs per (schematic id, Talos version, architecture),
//! under `<data_dir>/images/<schematic>/<version>/` with the names Image Factory uses
//! (`kernel-amd64`, `initramfs-amd64.xz`). Files are written to a temporary name, fsynced, verified
//! and renamed into place, so a reader never sees half a file; a `.sha256` beside each file records
//! its digest, which also serves as its HTTP ETag.
//!
//! Imports no front door and no store.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::domain::dhcp::Arch;

mod pull;
pub use pull::{ImagePuller, Progress, PullError};

use crate::service::ports::{CachedImage, FetchProgress, ImageFetchError, TalosImages};

/// Image Factory's id of the schematic without customizations (`customization: {}`).
pub const VANILLA_SCHEMATIC: &str =
    "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

/// Why an image operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A name that cannot be part of a path.
    #[error("{field}: `{value}` is not valid ({why})")]
    Invalid {
        /// Which argument.
        field: &'static str,
        /// The value.
        value: String,
        /// What is accepted.
        why: &'static str,
    },
    /// File system.
    #[error("{0}")]
    Io(String),
}

/// The image cache with, when configured, the Image Factory that fills it on demand: the
/// implementation of the service's `TalosImages` port.
#[derive(Clone, Debug)]
pub struct ImageDepot {
    cache: ImageCache,
    puller: Option<ImagePuller>,
}

impl ImageDepot {
    /// `cache`, filled on demand from `puller` when given.
    pub fn new(cache: ImageCache, puller: Option<ImagePuller>) -> Self {
        ImageDepot { cache, puller }
    }
}

#[async_trait::async_trait]
impl TalosImages for ImageDepot {
    fn cached(
        &self,
        schematic: &str,
        version: &str,
        file: &str,
    ) -> Result<Option<CachedImage>, String> {
        match self.cache.path(schematic, version, file) {
            Ok(Some(path)) => Ok(Some(CachedImage {
                sha256: self.cache.digest(&path),
                path,
            })),
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    fn source(&self) -> Option<String> {
        self.puller.as_ref().map(|p| p.factory().to_string())
    }

    async fn fetch(
        &self,
        schematic: &str,
        version: &str,
        file: &str,
        progress: Option<FetchProgress>,
    ) -> Result<(), ImageFetchError> {
        let Some(puller) = &self.puller else {
            return Err(ImageFetchError::NoSource);
        };
        match puller.ensure(schematic, version, file, progress).await {
            Ok(_) => Ok(()),
            Err(PullError::Cache(ImageError::Invalid { .. })) => Err(ImageFetchError::Invalid(
                format!("{schematic}/{version}/{file}"),
            )),
            Err(e @ PullError::Refused { .. }) => Err(ImageFetchError::Refused(e.to_string())),
            Err(e) => Err(ImageFetchError::Failed(e.to_string())),
        }
    }
}

/// One cached file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CachedFile {
    /// Schematic id.
    pub schematic: String,
    /// Talos version, `v1.11.6`.
    pub version: String,
    /// File name, `kernel-amd64`.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256, hex.
    pub sha256: String,
}

/// The arch suffix Image Factory uses.
pub fn arch_name(a: Arch) -> &'static str {
    match a {
        Arch::Amd64 => "amd64",
        Arch::Arm64 => "arm64",
    }
}

/// Kernel file name.
pub fn kernel_name(a: Arch) -> String {
    format!("kernel-{}", arch_name(a))
}

/// Initramfs file name.
pub fn initramfs_name(a: Arch) -> String {
    format!("initramfs-{}.xz", arch_name(a))
}

fn check_version(v: &str) -> Result<(), ImageError> {
    let ok = v.starts_with('v')
        && v.len() <= 64
        && v[1..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
        && v[1..].chars().next().is_some_and(|c| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(ImageError::Invalid {
            field: "version",
            value: v.into(),
            why: "a Talos version such as v1.11.6",
        })
    }
}

fn check_schematic(s: &str) -> Result<(), ImageError> {
    if s.len() == 64
        && s.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    {
        Ok(())
    } else {
        Err(ImageError::Invalid {
            field: "schematic",
            value: s.into(),
            why: "64 lower-case hex digits",
        })
    }
}

fn check_name(n: &str) -> Result<(), ImageError> {
    let ok = [
        "kernel-amd64",
        "kernel-arm64",
        "initramfs-amd64.xz",
        "initramfs-arm64.xz",
    ]
    .contains(&n);
    if ok {
        Ok(())
    } else {
        Err(ImageError::Invalid {
            field: "file",
            value: n.into(),
            why: "kernel-<arch> or initramfs-<arch>.xz",
        })
    }
}

/// The cache directory.
#[derive(Clone, Debug)]
pub struct ImageCache {
    root: PathBuf,
}

fn io(e: std::io::Error, what: &Path) -> ImageError {
    ImageError::Io(format!("{}: {e}", what.display()))
}

impl ImageCache {
    /// A cache at `root` (created on first import).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Path of a cached file, if it is there (names checked, so no path escapes the cache).
    pub fn path(
        &self,
        schematic: &str,
        version: &str,
        name: &str,
    ) -> Result<Option<PathBuf>, ImageError> {
        check_schematic(schematic)?;
        check_version(version)?;
        check_name(name)?;
        let p = self.root.join(schematic).join(version).join(name);
        Ok(p.is_file().then_some(p))
    }

    /// The recorded SHA-256 of a cached file.
    pub fn digest(&self, path: &Path) -> Option<String> {
        let mut d = path.as_os_str().to_owned();
        d.push(".sha256");
        std::fs::read_to_string(d)
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// Copy `src` into the cache atomically and return its record.
    pub fn import(
        &self,
        schematic: &str,
        version: &str,
        name: &str,
        src: &Path,
    ) -> Result<CachedFile, ImageError> {
        check_schematic(schematic)?;
        check_version(version)?;
        check_name(name)?;
        let dir = self.root.join(schematic).join(version);
        std::fs::create_dir_all(&dir).map_err(|e| io(e, &dir))?;
        let tmp = dir.join(format!(".{name}.{}.partial", std::process::id()));
        let mut input = std::fs::File::open(src).map_err(|e| io(e, src))?;
        let mut out = std::fs::File::create(&tmp).map_err(|e| io(e, &tmp))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = input.read(&mut buf).map_err(|e| io(e, src))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(|e| io(e, &tmp))?;
            size += n as u64;
        }
        if size == 0 {
            let _ = std::fs::remove_file(&tmp);
            return Err(ImageError::Invalid {
                field: "file",
                value: src.display().to_string(),
                why: "empty file",
            });
        }
        out.sync_all().map_err(|e| io(e, &tmp))?;
        drop(out);
        let sha = hex::encode(hasher.finalize());
        let dst = dir.join(name);
        let mut digest = dst.as_os_str().to_owned();
        digest.push(".sha256");
        std::fs::write(&digest, format!("{sha}\n")).map_err(|e| io(e, Path::new(&digest)))?;
        std::fs::rename(&tmp, &dst).map_err(|e| io(e, &dst))?;
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(CachedFile {
            schematic: schematic.into(),
            version: version.into(),
            name: name.into(),
            size,
            sha256: sha,
        })
    }

    /// Where a download of `name` is written before [`ImageCache::adopt`] moves it into place
    /// (same directory, so the rename is atomic). Creates the directory.
    pub fn download_path(
        &self,
        schematic: &str,
        version: &str,
        name: &str,
    ) -> Result<PathBuf, ImageError> {
        check_schematic(schematic)?;
        check_version(version)?;
        check_name(name)?;
        let dir = self.root.join(schematic).join(version);
        std::fs::create_dir_all(&dir).map_err(|e| io(e, &dir))?;
        let mut nonce = [0u8; 8];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce);
        Ok(dir.join(format!(".{name}.{}.download", hex::encode(nonce))))
    }

    /// Move a finished, fsynced download (from [`ImageCache::download_path`]) into place with its
    /// digest.
    pub fn adopt(
        &self,
        schematic: &str,
        version: &str,
        name: &str,
        tmp: &Path,
        size: u64,
        sha256: &str,
    ) -> Result<CachedFile, ImageError> {
        check_schematic(schematic)?;
        check_version(version)?;
        check_name(name)?;
        let dir = self.root.join(schematic).join(version);
        let dst = dir.join(name);
        let mut digest = dst.as_os_str().to_owned();
        digest.push(".sha256");
        std::fs::write(&digest, format!("{sha256}\n")).map_err(|e| io(e, Path::new(&digest)))?;
        std::fs::rename(tmp, &dst).map_err(|e| io(e, &dst))?;
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(CachedFile {
            schematic: schematic.into(),
            version: version.into(),
            name: name.into(),
            size,
            sha256: sha256.into(),
        })
    }

    /// Every cached file.
    pub fn list(&self) -> Vec<CachedFile> {
        let mut out = Vec::new();
        let Ok(schematics) = std::fs::read_dir(&self.root) else {
            return out;
        };
        for s in schematics.flatten() {
            let Ok(versions) = std::fs::read_dir(s.path()) else {
                continue;
            };
            for v in versions.flatten() {
                let Ok(files) = std::fs::read_dir(v.path()) else {
                    continue;
                };
                for f in files.flatten() {
                    let name = f.file_name().to_string_lossy().into_owned();
                    if check_name(&name).is_err() {
                        continue;
                    }
                    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                    out.push(CachedFile {
                        schematic: s.file_name().to_string_lossy().into_owned(),
                        version: v.file_name().to_string_lossy().into_owned(),
                        sha256: self.digest(&f.path()).unwrap_or_default(),
                        name,
                        size,
                    });
                }
            }
        }
        out.sort_by(|a, b| {
            (&a.schematic, &a.version, &a.name).cmp(&(&b.schematic, &b.version, &b.name))
        });
        out
    }

    /// Remove a version (all its files) of a schematic; returns how many files went.
    pub fn remove(&self, schematic: &str, version: &str) -> Result<usize, ImageError> {
        check_schematic(schematic)?;
        check_version(version)?;
        let dir = self.root.join(schematic).join(version);
        let n = self
            .list()
            .iter()
            .filter(|f| f.schematic == schematic && f.version == version)
            .count();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| io(e, &dir))?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_list_remove() {
        let dir = tempfile::tempdir().expect("tmp");
        let cache = ImageCache::new(dir.path().join("images"));
        let src = dir.path().join("vmlinuz");
        std::fs::write(&src, b"kernel bytes").expect("src");
        let f = cache
            .import(VANILLA_SCHEMATIC, "v1.11.6", "kernel-amd64", &src)
            .expect("import");
        assert_eq!(f.size, 12);
        assert_eq!(f.sha256, hex::encode(Sha256::digest(b"kernel bytes")));
        let p = cache
            .path(VANILLA_SCHEMATIC, "v1.11.6", "kernel-amd64")
            .expect("ok")
            .expect("there");
        assert_eq!(std::fs::read(&p).expect("read"), b"kernel bytes");
        assert_eq!(cache.digest(&p).as_deref(), Some(f.sha256.as_str()));
        assert_eq!(cache.list(), vec![f]);
        assert!(cache
            .path(VANILLA_SCHEMATIC, "v1.11.6", "../../etc/passwd")
            .is_err());
        assert!(cache.path("..", "v1.11.6", "kernel-amd64").is_err());
        assert!(cache
            .path(VANILLA_SCHEMATIC, "1.11.6", "kernel-amd64")
            .is_err());
        assert_eq!(cache.remove(VANILLA_SCHEMATIC, "v1.11.6").expect("rm"), 1);
        assert!(cache.list().is_empty());
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").expect("empty");
        assert!(cache
            .import(VANILLA_SCHEMATIC, "v1.11.6", "kernel-amd64", &empty)
            .is_err());
    }
}

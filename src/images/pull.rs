//! Fetching Talos kernels and initramfs images from an Image Factory
//! (`<factory>/image/<schematic>/<version>/kernel-<arch>` and `initramfs-<arch>.xz`) into the
//! cache: streamed to a temporary file beside the destination, checked (HTTP 200, the announced
//! length, the kernel or xz magic so an error page is never cached), fsynced and renamed into
//! place. Downloads are single-flight per file: a thousand machines asking for an image that is
//! not cached yet cause one upstream download; the others wait for it and read the cache.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::{initramfs_name, kernel_name, CachedFile, ImageCache, ImageError};
use crate::domain::dhcp::Arch;

/// Called as bytes arrive: (file name, bytes so far, total when announced).
pub type Progress = Arc<dyn Fn(&str, u64, Option<u64>) + Send + Sync>;

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// A bad name or a cache write.
    #[error(transparent)]
    Cache(#[from] ImageError),
    /// The factory could not be reached or the transfer broke.
    #[error("{url}: {reason}")]
    Transfer {
        /// What was fetched.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The factory answered, but not with the file.
    #[error("{url}: {reason}")]
    Refused {
        /// What was fetched.
        url: String,
        /// What it answered.
        reason: String,
    },
}

/// Downloads images from one Image Factory into one cache.
#[derive(Clone)]
pub struct ImagePuller {
    cache: ImageCache,
    base: String,
    client: reqwest::Client,
    flights: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl std::fmt::Debug for ImagePuller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImagePuller")
            .field("factory", &self.base)
            .finish_non_exhaustive()
    }
}

impl ImagePuller {
    /// Pull from the factory at `base` (e.g. `https://factory.talos.dev`) into `cache`.
    pub fn new(cache: ImageCache, base: &str) -> Result<Self, PullError> {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(20))
            .read_timeout(std::time::Duration::from_secs(60))
            .user_agent(concat!("plinth/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| PullError::Transfer {
                url: base.into(),
                reason: e.to_string(),
            })?;
        Ok(ImagePuller {
            cache,
            base: base.trim_end_matches('/').to_string(),
            client,
            flights: Arc::default(),
        })
    }

    /// The factory's base URL.
    pub fn factory(&self) -> &str {
        &self.base
    }

    /// Kernel and initramfs of (schematic, version, arch), downloaded where missing.
    pub async fn pull(
        &self,
        schematic: &str,
        version: &str,
        arch: Arch,
        progress: Option<Progress>,
    ) -> Result<Vec<(CachedFile, bool)>, PullError> {
        let mut out = Vec::new();
        for name in [kernel_name(arch), initramfs_name(arch)] {
            out.push(
                self.ensure(schematic, version, &name, progress.clone())
                    .await?,
            );
        }
        Ok(out)
    }

    /// The cached file, downloaded first when missing (single-flight); the flag says whether this
    /// call downloaded it.
    pub async fn ensure(
        &self,
        schematic: &str,
        version: &str,
        name: &str,
        progress: Option<Progress>,
    ) -> Result<(CachedFile, bool), PullError> {
        if let Some(f) = self.cached(schematic, version, name)? {
            return Ok((f, false));
        }
        let key = format!("{schematic}/{version}/{name}");
        let flight = {
            let mut f = self
                .flights
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            f.entry(key.clone()).or_default().clone()
        };
        let _only_one = flight.lock().await;
        if let Some(f) = self.cached(schematic, version, name)? {
            return Ok((f, false));
        }
        let result = self.download(schematic, version, name, progress).await;
        if let Ok(mut f) = self.flights.lock() {
            f.remove(&key);
        }
        result.map(|f| (f, true))
    }

    fn cached(
        &self,
        schematic: &str,
        version: &str,
        name: &str,
    ) -> Result<Option<CachedFile>, PullError> {
        let Some(p) = self.cache.path(schematic, version, name)? else {
            return Ok(None);
        };
        let size = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        Ok(Some(CachedFile {
            schematic: schematic.into(),
            version: version.into(),
            name: name.into(),
            size,
            sha256: self.cache.digest(&p).unwrap_or_default(),
        }))
    }

    async fn download(
        &self,
        schematic: &str,
        version: &str,
        name: &str,
        progress: Option<Progress>,
    ) -> Result<CachedFile, PullError> {
        let url = format!("{}/image/{schematic}/{version}/{name}", self.base);
        let transfer = |reason: String| PullError::Transfer {
            url: url.clone(),
            reason,
        };
        let tmp: PathBuf = self.cache.download_path(schematic, version, name)?;
        let result = async {
            let mut resp = self
                .client
                .get(&url)
                .send()
                .await
                .map_err(|e| transfer(e.to_string()))?;
            if resp.status() != reqwest::StatusCode::OK {
                return Err(PullError::Refused {
                    url: url.clone(),
                    reason: format!(
                        "HTTP {} (is the schematic id and the version right, and does the factory build it?)",
                        resp.status()
                    ),
                });
            }
            let total = resp.content_length();
            let mut file = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| transfer(format!("{}: {e}", tmp.display())))?;
            let mut hasher = Sha256::new();
            let mut size = 0u64;
            let mut head = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| transfer(e.to_string()))? {
                if head.len() < 1024 {
                    head.extend_from_slice(&chunk[..chunk.len().min(1024 - head.len())]);
                }
                hasher.update(&chunk);
                file.write_all(&chunk)
                    .await
                    .map_err(|e| transfer(format!("{}: {e}", tmp.display())))?;
                size += chunk.len() as u64;
                if let Some(p) = &progress {
                    p(name, size, total);
                }
            }
            if let Some(t) = total {
                if t != size {
                    return Err(transfer(format!("got {size} of {t} bytes")));
                }
            }
            if let Err(why) = check_magic(name, &head) {
                return Err(PullError::Refused {
                    url: url.clone(),
                    reason: why,
                });
            }
            file.sync_all()
                .await
                .map_err(|e| transfer(format!("{}: {e}", tmp.display())))?;
            drop(file);
            let sha = hex::encode(hasher.finalize());
            Ok(self
                .cache
                .adopt(schematic, version, name, &tmp, size, &sha)?)
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        if let Ok(f) = &result {
            tracing::info!(url = %url, bytes = f.size, sha256 = %f.sha256, "image pulled");
        }
        result
    }
}

/// Is `head` the start of what `name` should be? Kernels: x86 bzImage (`HdrS` at 0x202) or an
/// arm64 Image (`ARM\x64` at 0x38); initramfs: xz (`FD 37 7A 58 5A 00`).
fn check_magic(name: &str, head: &[u8]) -> Result<(), String> {
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    if name.starts_with("kernel-") {
        if at(0x202, b"HdrS") || at(0x38, b"ARM\x64") {
            return Ok(());
        }
        return Err("the answer is not a Linux kernel (no bzImage or arm64 Image header)".into());
    }
    if name.ends_with(".xz") {
        if at(0, &[0xFD, b'7', b'z', b'X', b'Z', 0x00]) {
            return Ok(());
        }
        return Err("the answer is not xz-compressed".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_tells_kernels_and_xz_from_error_pages() {
        let mut bz = vec![0u8; 0x300];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert!(check_magic("kernel-amd64", &bz).is_ok());
        let mut arm = vec![0u8; 0x40];
        arm[0x38..0x3c].copy_from_slice(b"ARM\x64");
        assert!(check_magic("kernel-arm64", &arm).is_ok());
        assert!(check_magic("kernel-amd64", b"<html>not found</html>").is_err());
        assert!(check_magic("initramfs-amd64.xz", &[0xFD, b'7', b'z', b'X', b'Z', 0, 1]).is_ok());
        assert!(check_magic("initramfs-amd64.xz", b"\x1f\x8b gzip").is_err());
    }
}

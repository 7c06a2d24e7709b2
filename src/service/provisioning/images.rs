//! The Talos images a boot needs, and the pull policy: a kernel or initramfs the cache lacks is
//! downloaded from the configured Image Factory, once however many machines ask, and only for a
//! schematic and version that a declared cluster uses, so a request alone can never make Plinth
//! fetch anything. Both image doors (the main port's route and the sendfile listener) answer
//! through `ProvisioningService::image`.
//!
//! Imports `domain`, the ports and the rest of `service`.

use std::net::IpAddr;

use super::timeline::Step;
use super::ProvisioningService;
use crate::domain::dhcp::Arch;
use crate::service::ports::{CachedImage, ImageFetchError};

/// One request for a file of the image cache.
#[derive(Clone, Copy, Debug)]
pub struct ImageRequest<'a> {
    /// Schematic id.
    pub schematic: &'a str,
    /// Talos version.
    pub version: &'a str,
    /// File name (`kernel-amd64`, `initramfs-amd64.xz`).
    pub file: &'a str,
    /// Who asks.
    pub peer: IpAddr,
    /// A `GET` of the whole file (not `HEAD`, not a `Range`): a boot step on the timeline.
    pub whole_get: bool,
}

/// Why an image is not served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageRefusal {
    /// Not cached and not to be fetched (bad names, no factory, no declared cluster uses it, or
    /// the factory has no such file): 404.
    NotFound,
    /// The download from the factory failed: 502.
    Upstream,
    /// Plinth cannot decide now (a store fault): 503.
    Unavailable,
}

/// Kernel and initramfs names of an architecture, as Image Factory names them.
pub(super) fn image_files(arch: Arch) -> [String; 2] {
    let a = match arch {
        Arch::Amd64 => "amd64",
        Arch::Arm64 => "arm64",
    };
    [format!("kernel-{a}"), format!("initramfs-{a}.xz")]
}

/// Whether an image is there for a plan, or why not.
pub(super) enum Readiness {
    /// Both files are cached.
    Ready,
    /// A file is missing and is being downloaded (by this call's pull or an earlier one).
    Pulling {
        /// The file missing.
        file: String,
        /// Where from.
        source: String,
    },
    /// A file is missing and nothing will fetch it.
    Missing {
        /// The file missing.
        file: String,
    },
}

impl ProvisioningService {
    /// Resolve an image request to a cached file, pulling it first where the policy allows.
    /// Records the `http.image` timeline step of whole downloads.
    pub async fn image(&self, r: &ImageRequest<'_>) -> Result<CachedImage, ImageRefusal> {
        if r.whole_get {
            if let IpAddr::V4(ip) = r.peer {
                self.inner.timeline.record(Step {
                    kind: "http.image",
                    mac: None,
                    ip: Some(ip),
                    machine: None,
                    detail: serde_json::json!({"file": r.file, "version": r.version, "schematic": r.schematic}),
                });
            }
        }
        let images = &self.inner.images;
        let cached = || match images.cached(r.schematic, r.version, r.file) {
            Ok(found) => Ok(found),
            Err(_) => Err(ImageRefusal::NotFound),
        };
        if let Some(found) = cached()? {
            return Ok(found);
        }
        if images.source().is_none() || !self.declared(r.schematic, r.version).await? {
            return Err(ImageRefusal::NotFound);
        }
        match images.fetch(r.schematic, r.version, r.file).await {
            Ok(()) => cached()?.ok_or(ImageRefusal::NotFound),
            Err(
                ImageFetchError::Refused(_)
                | ImageFetchError::Invalid(_)
                | ImageFetchError::NoSource,
            ) => Err(ImageRefusal::NotFound),
            Err(ImageFetchError::Failed(e)) => {
                tracing::warn!(error = %e, "image pull failed");
                Err(ImageRefusal::Upstream)
            }
        }
    }

    /// Does a declared cluster use this schematic and version?
    async fn declared(&self, schematic: &str, version: &str) -> Result<bool, ImageRefusal> {
        match self.inner.configs.sources().await {
            Ok(src) => Ok(src
                .clusters
                .values()
                .any(|c| c.spec.schematic_id == schematic && c.spec.talos_version == version)),
            Err(e) => {
                tracing::error!(error = %e, "image request: declared clusters cannot be read");
                Err(ImageRefusal::Unavailable)
            }
        }
    }

    /// Are kernel and initramfs of (schematic, version, arch) cached for an install boot? When
    /// not, and a factory is configured, both are pulled in the background, one after the other
    /// and once however many machines ask (they hold and poll meanwhile).
    pub(super) fn readiness(&self, schematic: &str, version: &str, arch: Arch) -> Readiness {
        let images = &self.inner.images;
        let files = image_files(arch);
        let Some(missing) = files
            .iter()
            .find(|f| !matches!(images.cached(schematic, version, f), Ok(Some(_))))
        else {
            return Readiness::Ready;
        };
        let Some(source) = images.source() else {
            return Readiness::Missing {
                file: missing.clone(),
            };
        };
        let (images, schematic, version) =
            (images.clone(), schematic.to_string(), version.to_string());
        let file = missing.clone();
        tokio::spawn(async move {
            for f in &files {
                if let Err(e) = images.fetch(&schematic, &version, f).await {
                    tracing::warn!(error = %e, file = %f, "image pull failed");
                    return;
                }
            }
        });
        Readiness::Pulling { file, source }
    }
}

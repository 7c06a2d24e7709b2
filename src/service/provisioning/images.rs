//! The Talos images a boot needs, and the pull policy: a kernel or initramfs the cache lacks is
//! downloaded from the configured Image Factory, once however many machines ask, and only for a
//! schematic and version that a declared cluster uses, so a request alone can never make Plinth
//! fetch anything. Both image doors (the main port's route and the sendfile listener) answer
//! through `ProvisioningService::image`.
//!
//! Imports `domain`, the ports and the rest of `service`.

use std::net::IpAddr;
use std::sync::Arc;

use super::timeline::Step;
use super::ProvisioningService;
use crate::domain::dhcp::Arch;
use crate::domain::{Machine, MachineId};
use crate::service::ports::{CachedImage, FetchProgress, ImageFetchError, NewEvent};
use crate::service::ServiceError;

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
        match images.fetch(r.schematic, r.version, r.file, None).await {
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
    /// not, and a factory is configured, both are pulled in the background, together and once
    /// however many machines ask (they hold and poll meanwhile), with progress events on
    /// `machine`'s timeline.
    pub(super) fn readiness(
        &self,
        schematic: &str,
        version: &str,
        arch: Arch,
        machine: Option<MachineId>,
    ) -> Readiness {
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
        self.start_pull(schematic, version, arch, machine);
        Readiness::Pulling {
            file: missing.clone(),
            source,
        }
    }

    /// Check the Talos image of `m`'s cluster before a provision or a reinstall: `None` when it
    /// is cached (or the machine has no cluster), else a warning for the operator; when a factory
    /// is configured the pull starts now (progress as `image.pull_*` events of the machine).
    pub async fn prepare_image(&self, m: &Machine) -> Result<Option<String>, ServiceError> {
        let Some(cluster) = &m.cluster else {
            return Ok(None);
        };
        let sources = self.inner.configs.sources().await?;
        let Some(c) = sources.clusters.get(cluster) else {
            return Ok(None);
        };
        let (schematic, version) = (&c.spec.schematic_id, &c.spec.talos_version);
        // The architecture shows only when the machine boots (iPXE's buildarch): amd64 until then.
        let arch = Arch::Amd64;
        Ok(match self.readiness(schematic, version, arch, Some(m.id)) {
            Readiness::Ready => None,
            Readiness::Missing { file } => Some(format!(
                "Talos {version} {file} of schematic {schematic} is not in the image cache and no Image Factory is configured ([images] factory_url): the machine will wait at boot until you run `{}`",
                pull_command(schematic, version, arch)
            )),
            Readiness::Pulling { file, source } => Some(format!(
                "Talos {version} {file} of schematic {schematic} is not in the image cache yet: pulling kernel and initramfs from {source} now (image.pull_* events); the machine waits at boot until it is done"
            )),
        })
    }

    /// Pull kernel and initramfs of (schematic, version, arch) in the background unless a pull of
    /// them is already under way.
    fn start_pull(&self, schematic: &str, version: &str, arch: Arch, machine: Option<MachineId>) {
        let key = format!("{schematic}/{version}/{}", image_files(arch)[0]);
        {
            let mut pulls = self
                .pulls
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if !pulls.insert(key.clone()) {
                return;
            }
        }
        let (this, schematic, version) = (self.clone(), schematic.to_string(), version.to_string());
        tokio::spawn(async move {
            this.pull_both(&schematic, &version, arch, machine).await;
            if let Ok(mut pulls) = this.pulls.lock() {
                pulls.remove(&key);
            }
        });
    }

    async fn note(&self, machine: Option<MachineId>, kind: &str, detail: serde_json::Value) {
        let event = NewEvent {
            machine_id: machine,
            kind: kind.into(),
            actor: "plinth".into(),
            detail,
        };
        if let Err(e) = self.inner.events.append_event(&event).await {
            tracing::warn!(error = %e, kind, "image pull event not written");
        }
    }

    /// Kernel then initramfs, each downloaded at most once (single-flight in the port), with an
    /// `image.pull_started` event, an `image.pull_progress` event per file at every tenth of its
    /// announced size (every 16 MiB when none is announced), and `image.pull_done` or
    /// `image.pull_failed`.
    async fn pull_both(
        &self,
        schematic: &str,
        version: &str,
        arch: Arch,
        machine: Option<MachineId>,
    ) {
        let images = self.inner.images.clone();
        let files = image_files(arch);
        let base = serde_json::json!({"schematic": schematic, "version": version, "files": files});
        self.note(machine, "image.pull_started", serde_json::json!({
            "schematic": schematic, "version": version, "files": files, "source": images.source(),
        }))
        .await;
        for file in &files {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, Option<u64>)>(PROGRESS_QUEUE);
            let last = std::sync::Mutex::new(0u64);
            let progress: FetchProgress = Arc::new(move |_name, bytes, total| {
                let mark = match total {
                    Some(t) if t > 0 => bytes.saturating_mul(10) / t,
                    _ => bytes / PROGRESS_STEP_BYTES,
                };
                let mut seen = last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if mark > *seen {
                    *seen = mark;
                    // A full queue drops a step rather than slowing the download.
                    let _ = tx.try_send((bytes, total));
                }
            });
            let this = self.clone();
            let name = file.clone();
            let writer = tokio::spawn(async move {
                while let Some((bytes, total)) = rx.recv().await {
                    let percent = total
                        .filter(|t| *t > 0)
                        .map(|t| bytes.saturating_mul(100) / t);
                    this.note(
                        machine,
                        "image.pull_progress",
                        serde_json::json!({
                            "file": name, "bytes": bytes, "total": total, "percent": percent,
                        }),
                    )
                    .await;
                }
            });
            let result = images.fetch(schematic, version, file, Some(progress)).await;
            let _ = writer.await;
            if let Err(e) = result {
                tracing::warn!(error = %e, file = %file, "image pull failed");
                self.note(machine, "image.pull_failed", serde_json::json!({
                    "schematic": schematic, "version": version, "file": file, "error": e.to_string(),
                    "command": pull_command(schematic, version, arch),
                }))
                .await;
                return;
            }
        }
        self.note(machine, "image.pull_done", base).await;
    }
}

/// Progress events queued per file before steps are dropped.
const PROGRESS_QUEUE: usize = 16;
/// Without an announced size, a progress event every this many bytes.
const PROGRESS_STEP_BYTES: u64 = 16 << 20;

/// The command an operator runs to put an image in the cache.
pub fn pull_command(schematic: &str, version: &str, arch: Arch) -> String {
    let a = match arch {
        Arch::Amd64 => "amd64",
        Arch::Arm64 => "arm64",
    };
    format!("plinth image pull --version {version} --arch {a} --schematic {schematic}")
}

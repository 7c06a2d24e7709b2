//! The Talos image port: the local cache of kernels and initramfs (by schematic, version and Image
//! Factory file name) and, when a factory is configured, downloads of what it lacks. Implemented by
//! `crate::images`.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

/// A cached image file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedImage {
    /// Where it is.
    pub path: PathBuf,
    /// Its SHA-256 (hex), when recorded.
    pub sha256: Option<String>,
}

/// Told as a download goes: (file name, bytes so far, total when announced).
pub type FetchProgress = Arc<dyn Fn(&str, u64, Option<u64>) + Send + Sync>;

/// Why a missing image could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum ImageFetchError {
    /// No factory is configured.
    #[error("no Image Factory is configured ([images] factory_url)")]
    NoSource,
    /// The names cannot name an image.
    #[error("{0}")]
    Invalid(String),
    /// The factory answered, but not with the file (a 404, an error page).
    #[error("{0}")]
    Refused(String),
    /// The transfer or the cache write failed.
    #[error("{0}")]
    Failed(String),
}

/// The image cache and where missing images come from.
#[async_trait]
pub trait TalosImages: Send + Sync + 'static {
    /// The cached file, if present; `Err` when the names cannot name a file of the cache.
    fn cached(
        &self,
        schematic: &str,
        version: &str,
        file: &str,
    ) -> Result<Option<CachedImage>, String>;

    /// Where missing images are downloaded from, when anywhere.
    fn source(&self) -> Option<String>;

    /// Download `file` into the cache (once however many callers ask at the same time), telling
    /// `progress` as bytes arrive.
    async fn fetch(
        &self,
        schematic: &str,
        version: &str,
        file: &str,
        progress: Option<FetchProgress>,
    ) -> Result<(), ImageFetchError>;
}

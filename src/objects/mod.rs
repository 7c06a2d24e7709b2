//! Object stores for etcd snapshots, through the `object_store` crate (Apache Arrow's): a
//! directory (`file:///var/lib/plinth/snapshots`) or any S3-compatible service
//! (`s3://bucket/prefix`). Implements the `ObjectStores` / `ObjectBucket` ports of
//! `crate::service::ports::snapshots`.
//!
//! S3 settings and credentials come from Plinth's configuration (`[snapshots]`: endpoint, region,
//! a credentials file outside Git, mode 0600) or the environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ENDPOINT`, `AWS_REGION`, `AWS_ALLOW_HTTP`
//! as `object_store` reads them), never from the inventory: a store URL names a bucket and a
//! prefix, nothing else, and is refused if it carries a user or password.
//!
//! Uploads are streamed as multipart uploads of `PART` bytes with at most `PARTS_IN_FLIGHT`
//! parts in flight: memory stays bounded whatever the object's size, and the object appears
//! whole (the upload is completed) or not at all (aborted). Imports `service::ports` only.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use object_store::aws::AmazonS3Builder;
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use tokio::io::AsyncWriteExt as _;

use crate::domain::snapshots::{parse_store_url, StoreUrl};
use crate::service::ports::snapshots::{
    ByteStream, ObjectBucket, ObjectError, ObjectStores, S3Settings,
};

/// Bytes of one multipart part (S3 wants at least 5 MiB but the last).
pub const PART: usize = 8 << 20;
/// Parts uploaded at once.
pub const PARTS_IN_FLIGHT: usize = 2;

/// The credentials file's content.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialsFile {
    access_key_id: String,
    secret_access_key: String,
    #[serde(default)]
    session_token: Option<String>,
}

/// Opens stores by URL with the S3 settings of the configuration.
#[derive(Clone, Debug, Default)]
pub struct Stores {
    s3: S3Settings,
}

impl Stores {
    /// With these S3 settings.
    pub fn new(s3: S3Settings) -> Self {
        Stores { s3 }
    }
}

fn err(store: &str, object: &str, e: impl std::fmt::Display) -> ObjectError {
    ObjectError {
        store: store.to_string(),
        object: object.to_string(),
        cause: e.to_string(),
        not_found: false,
    }
}

fn from_os(store: &str, object: &str, e: object_store::Error) -> ObjectError {
    let not_found = matches!(e, object_store::Error::NotFound { .. });
    ObjectError {
        not_found,
        ..err(store, object, e)
    }
}

impl ObjectStores for Stores {
    fn open(&self, url: &str) -> Result<Arc<dyn ObjectBucket>, ObjectError> {
        let parsed = parse_store_url(url).map_err(|e| err(url, "", e))?;
        let mut root = None;
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match parsed {
            StoreUrl::Dir(dir) => {
                root = Some(dir.clone());
                std::fs::create_dir_all(&dir)
                    .map_err(|e| err(url, "", format!("cannot create {}: {e}", dir.display())))?;
                let fs = LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| err(url, "", e))?
                    .with_automatic_cleanup(true);
                (Arc::new(fs), String::new())
            }
            StoreUrl::S3 { bucket, prefix } => {
                let mut b = AmazonS3Builder::from_env().with_bucket_name(&bucket);
                if let Some(e) = &self.s3.endpoint {
                    b = b.with_endpoint(e);
                }
                if let Some(r) = &self.s3.region {
                    b = b.with_region(r);
                }
                if self.s3.allow_http {
                    b = b.with_allow_http(true);
                }
                if let Some(path) = &self.s3.credentials_file {
                    let text = std::fs::read_to_string(path).map_err(|e| {
                        err(
                            url,
                            "",
                            format!("snapshots.s3_credentials_file {}: {e}", path.display()),
                        )
                    })?;
                    let c: CredentialsFile = toml::from_str(&text).map_err(|e| {
                        err(
                            url,
                            "",
                            format!(
                                "snapshots.s3_credentials_file {}: {} (want access_key_id and secret_access_key)",
                                path.display(),
                                e.message()
                            ),
                        )
                    })?;
                    b = b
                        .with_access_key_id(c.access_key_id)
                        .with_secret_access_key(c.secret_access_key);
                    if let Some(t) = c.session_token {
                        b = b.with_token(t);
                    }
                }
                // Path-style requests work with every S3-compatible service.
                b = b.with_virtual_hosted_style_request(false);
                (Arc::new(b.build().map_err(|e| err(url, "", e))?), prefix)
            }
        };
        Ok(Arc::new(Bucket {
            url: url.to_string(),
            store,
            prefix,
            root,
        }))
    }
}

/// One opened store.
struct Bucket {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    /// The directory of a directory store.
    root: Option<std::path::PathBuf>,
}

impl Bucket {
    fn path(&self, object: &str) -> Result<ObjectPath, ObjectError> {
        let full = if self.prefix.is_empty() {
            object.to_string()
        } else {
            format!("{}/{object}", self.prefix)
        };
        ObjectPath::parse(&full).map_err(|e| err(&self.url, object, e))
    }
}

#[async_trait]
impl ObjectBucket for Bucket {
    fn url(&self) -> &str {
        &self.url
    }

    async fn put_stream(&self, object: &str, mut body: ByteStream) -> Result<u64, ObjectError> {
        let path = self.path(object)?;
        let mut w = BufWriter::with_capacity(self.store.clone(), path, PART)
            .with_max_concurrency(PARTS_IN_FLIGHT);
        let mut written = 0u64;
        let mut failed = None;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            written += chunk.len() as u64;
            if let Err(e) = w.put(chunk).await {
                failed = Some(from_os(&self.url, object, e));
                break;
            }
        }
        if let Some(e) = failed {
            // Leave no partial upload behind.
            let _ = w.abort().await;
            return Err(e);
        }
        w.shutdown().await.map_err(|e| err(&self.url, object, e))?;
        Ok(written)
    }

    async fn put_small(&self, object: &str, body: Bytes) -> Result<(), ObjectError> {
        let path = self.path(object)?;
        self.store
            .put(&path, body.into())
            .await
            .map(|_| ())
            .map_err(|e| from_os(&self.url, object, e))
    }

    async fn get_stream(&self, object: &str) -> Result<ByteStream, ObjectError> {
        let path = self.path(object)?;
        let got = self
            .store
            .get(&path)
            .await
            .map_err(|e| from_os(&self.url, object, e))?;
        let (url, name) = (self.url.clone(), object.to_string());
        Ok(got
            .into_stream()
            .map_err(move |e| from_os(&url, &name, e))
            .boxed())
    }

    async fn delete_partial(&self, object: &str) -> Result<(), ObjectError> {
        let Some(root) = &self.root else {
            return Ok(());
        };
        // `object_store`'s local multipart upload writes `<object>#<n>` and renames it when
        // complete; a process killed mid-upload leaves it.
        let path = self.path(object)?;
        let file = root.join(path.as_ref());
        let (Some(dir), Some(name)) = (file.parent(), file.file_name()) else {
            return Ok(());
        };
        let staged = format!("{}#", name.to_string_lossy());
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(err(&self.url, object, e)),
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&staged) {
                std::fs::remove_file(e.path()).map_err(|e| err(&self.url, object, e))?;
            }
        }
        Ok(())
    }

    async fn delete(&self, object: &str) -> Result<(), ObjectError> {
        let path = self.path(object)?;
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(from_os(&self.url, object, e)),
        }
    }
}

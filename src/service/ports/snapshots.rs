//! The ports of etcd snapshots and recovery (#20): the database's record of every snapshot, the
//! turn that lets one instance at a time take a cluster's snapshot, each cluster's one permitted
//! re-bootstrap from a snapshot; and the object stores snapshots are kept in (a directory, or an
//! S3-compatible service), implemented by `crate::objects`.
//!
//! Records only: no I/O here. Imports `super` (events, store errors), serde, chrono, uuid,
//! futures and bytes.

use std::fmt;
use std::path::PathBuf;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{NewEvent, StoreError};

/// Where a snapshot stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotState {
    /// Being streamed, encrypted and stored (or cut short by a crash: found and failed later).
    Taking,
    /// Stored, read back, decrypted and matched what the node streamed.
    Verified,
    /// Not usable: the error says why.
    Failed,
    /// Its object was removed by retention (the row stays as history).
    Deleted,
}

impl SnapshotState {
    /// The database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotState::Taking => "taking",
            SnapshotState::Verified => "verified",
            SnapshotState::Failed => "failed",
            SnapshotState::Deleted => "deleted",
        }
    }
}

impl std::str::FromStr for SnapshotState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "taking" => SnapshotState::Taking,
            "verified" => SnapshotState::Verified,
            "failed" => SnapshotState::Failed,
            "deleted" => SnapshotState::Deleted,
            other => return Err(format!("`{other}` is not a snapshot state")),
        })
    }
}

/// One etcd snapshot: where it is, what it holds, whether it was verified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SnapshotRecord {
    /// The snapshot's id (`plinth cluster recover NAME --snapshot ID`).
    pub id: Uuid,
    /// The cluster.
    pub cluster: String,
    /// Where it stands.
    pub state: SnapshotState,
    /// The store's URL (`s3://bucket/prefix`, `file:///path`); never credentials.
    pub store: String,
    /// The object's key under the store.
    pub object: String,
    /// The Plinth instance that took it.
    pub instance: String,
    /// `plinth` (the schedule) or the token's name.
    pub requested_by: String,
    /// When it was started.
    pub started_at: DateTime<Utc>,
    /// When it was stored (or failed).
    pub finished_at: Option<DateTime<Utc>>,
    /// When it was read back and verified.
    pub verified_at: Option<DateTime<Utc>>,
    /// The control plane it was streamed from (host name).
    pub taken_from: Option<String>,
    /// That control plane's address.
    pub taken_from_address: Option<String>,
    /// The Talos version the node reported.
    pub talos_version: Option<String>,
    /// The cluster's declared Kubernetes version (None: the Talos release's default).
    pub kubernetes_version: Option<String>,
    /// The cluster's nodes at the time (host names).
    pub nodes: Vec<String>,
    /// Bytes of the snapshot as etcd wrote it.
    pub size_bytes: Option<i64>,
    /// Bytes of the encrypted object.
    pub stored_bytes: Option<i64>,
    /// SHA-256 (hex) of the snapshot as etcd wrote it.
    pub sha256: Option<String>,
    /// etcd's revision in the snapshot.
    pub revision: Option<i64>,
    /// Fingerprint of the Plinth key that sealed it (names the key, reveals nothing of it).
    pub key_fingerprint: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
}

/// What a finished snapshot measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotOutcome {
    /// `Verified` or `Failed`.
    pub state: SnapshotState,
    /// When.
    pub at: DateTime<Utc>,
    /// Snapshot bytes.
    pub size_bytes: Option<i64>,
    /// Object bytes.
    pub stored_bytes: Option<i64>,
    /// SHA-256 (hex).
    pub sha256: Option<String>,
    /// etcd revision.
    pub revision: Option<i64>,
    /// Why it failed.
    pub error: Option<String>,
}

/// Where a cluster's recovery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryState {
    /// Claimed; the upload and the bootstrap follow (or their outcome is unknown).
    Calling,
    /// The node bootstrapped etcd from the snapshot.
    Done,
    /// It failed after the claim (the cluster's one re-bootstrap is used: a human decides).
    Failed,
}

impl RecoveryState {
    /// The database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RecoveryState::Calling => "calling",
            RecoveryState::Done => "done",
            RecoveryState::Failed => "failed",
        }
    }
}

impl std::str::FromStr for RecoveryState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "calling" => RecoveryState::Calling,
            "done" => RecoveryState::Done,
            "failed" => RecoveryState::Failed,
            other => return Err(format!("`{other}` is not a recovery state")),
        })
    }
}

/// A cluster's one recovery from a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RecoveryRecord {
    /// The cluster.
    pub cluster: String,
    /// This attempt.
    pub attempt_id: Uuid,
    /// The snapshot restored.
    pub snapshot_id: Uuid,
    /// The control plane it was restored on.
    pub node: String,
    /// Its address.
    pub node_address: String,
    /// The Plinth instance.
    pub instance: String,
    /// Who asked.
    pub requested_by: String,
    /// Started although etcd had quorum (with the typed confirmation).
    pub forced: bool,
    /// Where it stands.
    pub state: RecoveryState,
    /// Claimed at.
    pub claimed_at: DateTime<Utc>,
    /// The outcome's time.
    pub finished_at: Option<DateTime<Utc>>,
    /// What happened.
    pub detail: Option<String>,
}

/// What the snapshot use cases need from a database.
#[async_trait]
pub trait SnapshotStore: Send + Sync {
    /// Take `cluster`'s snapshot turn for `instance` until `until`, if no other instance holds
    /// an unexpired one (the same instance renews). `true`: taken.
    async fn take_snapshot_turn(
        &self,
        cluster: &str,
        instance: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// Give the turn back (only `instance`'s).
    async fn release_snapshot_turn(&self, cluster: &str, instance: &str) -> Result<(), StoreError>;

    /// Record a snapshot being taken, with its event, in one transaction.
    async fn insert_snapshot(&self, r: &SnapshotRecord, event: &NewEvent)
        -> Result<(), StoreError>;

    /// Write a snapshot's outcome (only while it is `taking`), with its event.
    async fn finish_snapshot(
        &self,
        id: Uuid,
        outcome: &SnapshotOutcome,
        event: &NewEvent,
    ) -> Result<bool, StoreError>;

    /// Mark a snapshot's object removed by retention, with its event.
    async fn mark_snapshot_deleted(&self, id: Uuid, event: &NewEvent) -> Result<bool, StoreError>;

    /// A cluster's snapshots, newest first (at most `limit`).
    async fn snapshots(&self, cluster: &str, limit: u32)
        -> Result<Vec<SnapshotRecord>, StoreError>;

    /// One snapshot.
    async fn snapshot(&self, id: Uuid) -> Result<Option<SnapshotRecord>, StoreError>;

    /// Claim the cluster's one recovery with its event. `Ok(Some(existing))`: it was claimed
    /// before (nothing written).
    async fn claim_recovery(
        &self,
        r: &RecoveryRecord,
        event: &NewEvent,
    ) -> Result<Option<RecoveryRecord>, StoreError>;

    /// Write the outcome of attempt `attempt_id` (only while `calling`), with its event.
    async fn finish_recovery(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        state: RecoveryState,
        detail: &str,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<bool, StoreError>;

    /// Drop the claim of attempt `attempt_id` (only while `calling`) with its event: nothing
    /// reached the node's etcd (the upload failed, or the bootstrap provably was not sent).
    async fn release_recovery(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        event: &NewEvent,
    ) -> Result<bool, StoreError>;

    /// A cluster's recovery, if claimed.
    async fn recovery(&self, cluster: &str) -> Result<Option<RecoveryRecord>, StoreError>;
}

/// A failure of an object store: which store, which object, what happened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("snapshot store {store}: {object}: {cause}")]
pub struct ObjectError {
    /// The store's URL.
    pub store: String,
    /// The object's key (empty: the store itself).
    pub object: String,
    /// The cause, in words (never a credential).
    pub cause: String,
    /// The object does not exist.
    pub not_found: bool,
}

/// A stream of an object's bytes, or of bytes to store.
pub type ByteStream = BoxStream<'static, Result<Bytes, ObjectError>>;

/// One object store (a directory or an S3 bucket and prefix), opened from its URL.
#[async_trait]
pub trait ObjectBucket: Send + Sync {
    /// The store's URL, for records and messages.
    fn url(&self) -> &str;

    /// Write `object` from `body`, streaming (memory bounded by the part size, whatever the
    /// object's size); the object appears whole or not at all. Returns the bytes written.
    async fn put_stream(&self, object: &str, body: ByteStream) -> Result<u64, ObjectError>;

    /// Write a small object whole.
    async fn put_small(&self, object: &str, body: Bytes) -> Result<(), ObjectError>;

    /// Read `object`, streaming.
    async fn get_stream(&self, object: &str) -> Result<ByteStream, ObjectError>;

    /// Remove `object` (absent: fine).
    async fn delete(&self, object: &str) -> Result<(), ObjectError>;

    /// Remove what an upload of `object` cut short by a crash left (a directory's staged part
    /// files; an S3 bucket's incomplete multipart uploads are left to its lifecycle rule).
    async fn delete_partial(&self, object: &str) -> Result<(), ObjectError>;
}

/// Opens object stores by URL (`s3://bucket/prefix`, `file:///path`), with credentials from
/// Plinth's own configuration or environment, never from the inventory.
pub trait ObjectStores: Send + Sync {
    /// The store `url` names.
    fn open(&self, url: &str) -> Result<std::sync::Arc<dyn ObjectBucket>, ObjectError>;
}

impl fmt::Display for SnapshotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[snapshots]` settings for S3-compatible stores (credentials from a file or the environment).
#[derive(Clone, Debug, Default)]
pub struct S3Settings {
    /// Endpoint URL, e.g. `https://s3.eu-central-1.amazonaws.com` or `http://127.0.0.1:9000`
    /// (default: `AWS_ENDPOINT`, else AWS itself).
    pub endpoint: Option<String>,
    /// Region (default: `AWS_REGION`, else `us-east-1`).
    pub region: Option<String>,
    /// Allow `http://` endpoints.
    pub allow_http: bool,
    /// A file holding `access_key_id = "..."` and `secret_access_key = "..."` (TOML).
    pub credentials_file: Option<PathBuf>,
}

//! The `StoreHealth` port: is the database reachable, does it take writes, and which secret key
//! are its sealed values sealed with? A port of its own because these are properties of the whole
//! database, not of one of its tables: `/healthz` and the start-up key check ask it without being
//! handed machines, events or leases. Imports `StoreError` only.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::error::StoreError;

/// One transaction of the store's group commit (the writes of DHCP leases and of every boot):
/// what an observer (`/metrics`) is told after it ended.
#[derive(Clone, Copy, Debug)]
pub struct CommitReport {
    /// Writes the transaction carried.
    pub writes: usize,
    /// How long its first write waited in the queue before the transaction began.
    pub waited: Duration,
    /// How long the transaction took, begin to commit (on SQLite the commit is an fsync of the
    /// WAL, `synchronous=FULL`; on PostgreSQL a commit, which flushes its WAL).
    pub took: Duration,
    /// Committed (false: rolled back, its writes retried one by one).
    pub committed: bool,
    /// Writes still queued behind it.
    pub queued: usize,
}

/// Told about every transaction of the group commit. Called on the writer's task after each
/// commit: an implementation must not wait (atomics only).
pub trait CommitObserver: Send + Sync + 'static {
    /// A transaction ended.
    fn transaction(&self, report: CommitReport);
}

/// Reachability, writability and the secret key's fingerprint of the database.
#[async_trait]
pub trait StoreHealth: Send + Sync + 'static {
    /// Is the database reachable? One round trip.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Does the database take writes? Upserts `instance`'s heartbeat row (one tiny transaction).
    async fn write_probe(&self, instance: &str) -> Result<(), StoreError>;

    /// The fingerprint of the secret key recorded in the database, if any.
    async fn key_fingerprint(&self) -> Result<Option<String>, StoreError>;

    /// Record `fingerprint` unless one is recorded already; the fingerprint on record after (the
    /// first one recorded wins, whichever instance wrote it).
    async fn claim_key_fingerprint(&self, fingerprint: &str) -> Result<String, StoreError>;

    /// Does the database hold any sealed value (a BMC password, a cluster's secrets or base
    /// configs, a served config, a sealed patch value)?
    async fn holds_sealed_values(&self) -> Result<bool, StoreError>;

    /// How the database's applied migrations compare with the ones this binary carries; reads
    /// only (`plinth doctor`).
    async fn migration_gap(&self) -> Result<MigrationGap, StoreError>;

    /// Report every transaction of the group commit to `observer` from now on (the first
    /// observer set stays). A store without a group commit ignores it.
    fn observe_commits(&self, observer: Arc<dyn CommitObserver>) {
        let _ = observer;
    }
}

/// The migrations of this binary the database has not applied, and the ones it has applied that
/// this binary does not know (a newer Plinth migrated it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrationGap {
    /// Migrations this binary carries.
    pub known: usize,
    /// Not applied yet, as `VERSION_description`.
    pub pending: Vec<String>,
    /// Applied versions this binary does not carry.
    pub unknown: Vec<i64>,
}

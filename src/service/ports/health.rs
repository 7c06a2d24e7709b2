//! The `StoreHealth` port: is the database reachable, does it take writes, and which secret key
//! are its sealed values sealed with? A port of its own because these are properties of the whole
//! database, not of one of its tables: `/healthz` and the start-up key check ask it without being
//! handed machines, events or leases. Imports `StoreError` only.

use async_trait::async_trait;

use super::error::StoreError;

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

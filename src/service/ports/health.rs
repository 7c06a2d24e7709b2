//! The `StoreHealth` port: is the database reachable? A port of its own because reachability is
//! a property of the whole database, not of one of its tables: `/healthz` asks it without being
//! handed machines, events or leases. Imports `StoreError` only.

use async_trait::async_trait;

use super::error::StoreError;

/// Reachability of the database.
#[async_trait]
pub trait StoreHealth: Send + Sync + 'static {
    /// Is the database reachable? One round trip.
    async fn ping(&self) -> Result<(), StoreError>;
}
